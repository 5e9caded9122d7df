"""``kvstack plan``: native vLLM CPU offload, kvstack with local tiers, kvstack with shared tiers,
or neither, for this workload, model and hardware?

    kvstack plan --model-preset llama-3-8b --hardware-preset h100-80gb \\
        --prompt-tokens 6500 --reuse-fraction 0.92 --prefix-groups 1 --requests-per-hour 200 \\
        --hbm-kv-usage 0.95

Every figure is a flag (``--num-layers``, ``--pcie-gbps``, ``--preemptions-per-hour``, …) or a
key of ``--config plan.yaml`` (sections ``model``, ``hardware``, ``workload``); flags win over
the file, the file over presets. It prints one recommendation with the numbers behind it: the
break-even HBM utilisation, the shortest context for which a load pays (per-request fixed costs
included; ``--measure-fixed-costs`` measures kvstack's on this host), the prefill tokens each
option saves per hour, and which input you did not give would change the answer.
``--json FILE`` writes the same figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import ValidationError

from kvstack.bench.plan.decide import make_plan
from kvstack.bench.plan.model import Hardware, PlanModelShape, WorkloadShape
from kvstack.bench.plan.report import format_plan, plan_document
from kvstack.errors import ConfigError
from kvstack.section import Section

__all__ = ["HARDWARE_PRESETS", "MODEL_PRESETS", "run"]

MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "llama-3-8b": {"num_layers": 32, "num_kv_heads": 8, "head_dim": 128, "weights_gib": 15.0},
    "qwen3-32b": {"num_layers": 64, "num_kv_heads": 8, "head_dim": 128, "weights_gib": 61.0},
    # 70B needs tensor parallelism in bf16: give the TP group's total --hbm-gib.
    "llama-3-70b": {"num_layers": 80, "num_kv_heads": 8, "head_dim": 128, "weights_gib": 131.0},
    # FP8 weights and KV: one 80 GB GPU holds it, with little room for KV.
    "llama-3-70b-fp8": {
        "num_layers": 80,
        "num_kv_heads": 8,
        "head_dim": 128,
        "dtype_bytes": 1,
        "weights_gib": 66.0,
    },
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


def _kind(annotation: Any) -> type[Any]:
    options = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else ()
    for candidate in (int, float):
        if annotation is candidate or candidate in options:
            return candidate
    return str


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack plan", description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, help="YAML with model / hardware / workload sections")
    p.add_argument("--model-preset", choices=sorted(MODEL_PRESETS))
    p.add_argument("--hardware-preset", choices=sorted(HARDWARE_PRESETS))
    p.add_argument("--json", type=Path, help="write the figures as JSON here")
    p.add_argument(
        "--measure-fixed-costs",
        action="store_true",
        help="measure kvstack's per-load fixed cost on this host; use it as load_fixed_s",
    )
    for section, cls in SECTIONS.items():
        group = p.add_argument_group(section)
        for name, field in cls.model_fields.items():
            group.add_argument("--" + name.replace("_", "-"), dest=f"{section}.{name}",
                               type=_kind(field.annotation), help=field.description)  # fmt: skip
    return p


def _inputs(args: argparse.Namespace) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """The values of each section, and which ``section.field`` the user set."""
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
    given = {f"{section}.{name}" for section, values in data.items() for name in values}
    if given & {"workload.request_rate", "workload.requests_per_hour"}:
        given |= {"workload.request_rate", "workload.requests_per_hour"}
    return data, given


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


def _measured(data: dict[str, dict[str, Any]], given: set[str]) -> None:
    from kvstack.bench.plan.measure import measure_fixed_costs

    costs = measure_fixed_costs()
    print("\n".join(costs.lines()) + "\n")
    if "hardware.load_fixed_s" not in given:
        data["hardware"]["load_fixed_s"] = costs.total_s
        given.add("hardware.load_fixed_s")


def run(command: str, argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        data, given = _inputs(args)
        if args.measure_fixed_costs:
            _measured(data, given)
        model, hw, wl = _validate(data)
    except ConfigError as exc:
        print(f"kvstack plan: {exc}", file=sys.stderr)
        return 2
    plan = make_plan(model, hw, wl, given)
    print(format_plan(model, hw, wl, plan))
    if args.json:
        document = {"inputs": {"model": model.model_dump(), "hardware": hw.model_dump(),
                               "workload": wl.model_dump()}, "given": sorted(given),
                    "plan": plan_document(plan)}  # fmt: skip
        args.json.write_text(json.dumps(document, indent=1, default=str))
    return 0
