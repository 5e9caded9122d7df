"""``kvstack plan``: do kvstack's KV tiers pay off for this workload, model and hardware?

    kvstack plan --model-preset llama-3-8b --hardware-preset h100-80gb \\
        --prompt-tokens 6000 --reuse-fraction 0.9 --working-set-tokens 3000000 \\
        --request-rate 20 --num-engines 4 --dram-gib 256 --disk-gib 2000

Every figure is a flag (``--num-layers``, ``--pcie-gbps``, ``--prefill-tokens-per-s``, …) or a
key of ``--config plan.yaml`` (sections ``model``, ``hardware``, ``workload``); flags win over
the file, the file over presets. Prints the KV footprint against HBM, load versus recompute
time per tier, the break-even points (when CPU offload starts to pay; below which prefix length
recomputing beats loading from disk or network), and the expected prefill time per request
with each tier configuration, then a recommendation. ``--json FILE`` writes the same figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kvstack.bench.plan.model import (
    GIB,
    Hardware,
    PlanModelShape,
    PlanResult,
    WorkloadShape,
    evaluate,
    prefill_s,
)
from kvstack.errors import ConfigError
from kvstack.section import Section

__all__ = ["HARDWARE_PRESETS", "MODEL_PRESETS", "format_plan", "run"]

MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "llama-3-8b": {"num_layers": 32, "num_kv_heads": 8, "head_dim": 128, "weights_gib": 15.0},
    "qwen3-32b": {"num_layers": 64, "num_kv_heads": 8, "head_dim": 128, "weights_gib": 61.0},
    # 70B needs tensor parallelism: give the TP group's total --hbm-gib.
    "llama-3-70b": {"num_layers": 80, "num_kv_heads": 8, "head_dim": 128, "weights_gib": 131.0},
}
HARDWARE_PRESETS: dict[str, dict[str, Any]] = {
    "h100-80gb": {"hbm_gib": 80, "pcie_gbps": 25, "disk_gbps": 5, "network_gbps": 10},
    "a100-80gb": {"hbm_gib": 80, "pcie_gbps": 20, "disk_gbps": 3, "network_gbps": 10},
    "l4-24gb": {"hbm_gib": 24, "pcie_gbps": 12, "disk_gbps": 2, "network_gbps": 3},
}
SECTIONS: dict[str, type[Section]] = {
    "model": PlanModelShape,
    "hardware": Hardware,
    "workload": WorkloadShape,
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack plan", description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, help="YAML with model / hardware / workload sections")
    p.add_argument("--model-preset", choices=sorted(MODEL_PRESETS))
    p.add_argument("--hardware-preset", choices=sorted(HARDWARE_PRESETS))
    p.add_argument("--json", type=Path, help="write the figures as JSON here")
    for section, cls in SECTIONS.items():
        group = p.add_argument_group(section)
        for name, field in cls.model_fields.items():
            kind: type[Any] = int if field.annotation is int else str
            if field.annotation is float:
                kind = float
            group.add_argument("--" + name.replace("_", "-"), dest=f"{section}.{name}",
                               type=kind, help=field.description)  # fmt: skip
    return p


def _inputs(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    if args.model_preset:
        data["model"].update(MODEL_PRESETS[args.model_preset])
    if args.hardware_preset:
        data["hardware"].update(HARDWARE_PRESETS[args.hardware_preset])
    if args.config:
        try:
            loaded = yaml.safe_load(args.config.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read plan config {str(args.config)!r}: {exc}") from None
        unknown = set(loaded) - set(SECTIONS)
        if unknown:
            raise ConfigError(f"unknown plan section(s) {sorted(unknown)}; use {sorted(SECTIONS)}")
        for section, values in loaded.items():
            data[section].update(values or {})
    for key, value in vars(args).items():
        section, dot, name = key.partition(".")
        if dot and value is not None:
            data[section][name] = value
    return data


def _validate(data: dict[str, dict[str, Any]]) -> tuple[PlanModelShape, Hardware, WorkloadShape]:
    out = []
    for section, cls in SECTIONS.items():
        try:
            out.append(cls.model_validate(data[section]))
        except ValidationError as exc:
            e = exc.errors()[0]
            where = ".".join(str(p) for p in e["loc"])
            raise ConfigError(f"{section}.{where}: {e['msg']} (got {e.get('input')!r})") from None
    model, hw, wl = out
    assert isinstance(model, PlanModelShape) and isinstance(hw, Hardware)
    assert isinstance(wl, WorkloadShape)
    return model, hw, wl


def _tokens(value: float | None) -> str:
    if value is None:
        return "never"
    return f"{value:,.0f} tokens"


def format_plan(model: PlanModelShape, hw: Hardware, wl: WorkloadShape, r: PlanResult) -> str:
    b = r.kv_bytes_per_token
    hbm = r.tiers[0]
    reused = wl.prompt_tokens * wl.reuse_fraction
    lines = [
        f"KV per token: {b / 1024:,.1f} KiB ({model.num_layers} layers x {model.num_kv_heads} KV "
        f"heads x {model.head_dim} x {model.dtype_bytes:g} B x 2)",
        f"HBM KV capacity per engine: {hbm.capacity_tokens:,.0f} tokens "
        f"({hbm.capacity_tokens * b / GIB:,.1f} GiB)",
        f"working set: {wl.working_set_tokens:,} tokens ({r.working_set_gib:,.1f} GiB); per engine "
        f"({wl.routing} routing, {hw.num_engines} engines): {r.per_engine_working_set_tokens:,.0f}"
        f" tokens = {r.per_engine_working_set_tokens / max(hbm.capacity_tokens, 1):.2f} x HBM",
        "",
        f"a reused prefix of {reused:,.0f} tokens: recompute {prefill_s(hw, 0, reused):.4f} s",
    ]
    for tier in r.tiers[1:]:
        lines.append(
            f"  load from {tier.name:<6} ({tier.bytes_per_s / 1e9:g} GB/s, "
            f"{tier.latency_s * 1e3:g} ms): {tier.load_s(reused, b):.4f} s; loading pays for "
            f"prefixes above {_tokens(r.break_even[tier.name])}"
        )
    offload = r.cpu_offload_pays_above_tokens
    lines += [
        "",
        "break-even points:",
        "  CPU offload starts to pay once the per-engine working set exceeds "
        + (f"{offload:,.0f} tokens (the HBM KV capacity)" if offload is not None else
           "- never: loading over PCIe is slower than recomputing")
        + (f", for prefixes above {_tokens(r.break_even['cpu'])}" if offload is not None else ""),
        f"  recompute is cheaper than loading from disk below {_tokens(r.break_even['disk'])}, "
        f"from the network below {_tokens(r.break_even['remote'])}",
        "",
        f"options at {wl.request_rate:g} requests/s over {hw.num_engines} engine(s):",
        "| option | hbm | cpu | disk | remote | miss | prefill+load s/request | busy/engine |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for o in r.options:
        share = [f"{o.hit_fractions.get(t, 0.0):.0%}" for t in ("hbm", "cpu", "disk", "remote")]
        lines.append(f"| {o.name} | {' | '.join(share)} | {o.miss_fraction:.0%} "
                     f"| {o.prefill_s_per_request:.4f} | {o.gpu_busy_fraction:.0%} |")  # fmt: skip
    lines += ["", _decide(r)]
    return "\n".join(lines)


def _decide(r: PlanResult) -> str:
    base = r.options[0]
    best = min(r.options, key=lambda o: o.prefill_s_per_request)
    if best is base or best.prefill_s_per_request > 0.95 * base.prefill_s_per_request:
        return ("decision: kvstack tiers do not pay for this workload (less than 5% prefill "
                "saved); vLLM's own prefix cache is enough.")  # fmt: skip
    saved = 1 - best.prefill_s_per_request / base.prefill_s_per_request
    note = " (prefill would be overloaded without it)" if base.gpu_busy_fraction > 1 else ""
    return f"decision: use {best.name.removeprefix('+ ')}: {saved:.0%} less prefill time{note}."


def run(command: str, argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        model, hw, wl = _validate(_inputs(args))
    except ConfigError as exc:
        print(f"kvstack plan: {exc}", file=sys.stderr)
        return 2
    result = evaluate(model, hw, wl)
    print(format_plan(model, hw, wl, result))
    if args.json:
        document = {"inputs": {"model": model.model_dump(), "hardware": hw.model_dump(),
                               "workload": wl.model_dump()}, "result": asdict(result)}  # fmt: skip
        args.json.write_text(json.dumps(document, indent=1, default=str))
    return 0
