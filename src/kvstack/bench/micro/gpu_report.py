"""The GPU check's verdicts and table: targets judged from :func:`.gpu_check.run_check`'s dict.

Targets (the issue's, on a GPU): the connector's copy-out and load at least 0.8x PyTorch's
pinned copy of the same bytes (median of the per-round ratios), and a matmul slowed by at most
10% while transfers run. Byte identity is not a target but a requirement: :func:`failures`
lists every round trip or copy whose bytes did not come back, and the script exits non-zero.
On CPU the figures are the same code's, but not what the targets are about.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvstack.bench.report import table

__all__ = [
    "COPY_RATIO_TARGET",
    "SLOWDOWN_TARGET",
    "WAYS",
    "failures",
    "format_table",
    "render_md",
    "targets",
]

# The copies the check times, against PyTorch's copy of the same bytes in the first three
# letters' direction; "_layers": one submission per layer, as layer pipelining runs them.
WAYS = ("d2h", "d2h_layers", "h2d", "h2d_layers")
COPY_RATIO_TARGET = 0.8
SLOWDOWN_TARGET = 0.10


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One verdict per configuration and target: name, figure, target, ok."""
    out: list[dict[str, Any]] = []
    for c in result["configs"]:
        name = _name(c)
        for way in _ways(c):
            ratio = c[way]["ratio"]["median"]
            out.append(_verdict(f"{name} {way} vs torch", ratio, f">= {COPY_RATIO_TARGET}x",
                                ratio >= COPY_RATIO_TARGET))  # fmt: skip
        slowdown = c["overlap"]["slowdown"]
        out.append(_verdict(f"{name} matmul slowdown", slowdown, f"<= {SLOWDOWN_TARGET:.0%}",
                            slowdown <= SLOWDOWN_TARGET))  # fmt: skip
    return out


def failures(result: dict[str, Any]) -> list[str]:
    """Every place whose bytes did not survive the round trip ([] when all did)."""
    bad = [f"{_name(c)} copy" for c in result["configs"] if not c["copy_byte_identical"]]
    for c in result["configs"]:
        bad += [
            f"{_name(c)} {tier} round trip"
            for tier, trip in c["round_trips"].items()
            if not trip["byte_identical"]
        ]
    if not result["kv_bench"]["byte_identical"]:
        bad.append("kvstack bench kv --device")
    return bad


def format_table(result: dict[str, Any]) -> str:
    link = result["link_peak"]
    lines = [
        f"device {result['meta']['device_name']} ({result['meta']['device']}); link peak "
        f"(pinned copy of {link['bytes'] >> 20} MiB): d2h {_g(link['d2h_gbps'])}, "
        f"h2d {_g(link['h2d_gbps'])} GB/s; medians (min-max)",
        f"{'configuration':38} {'way':10} {'connector GB/s':>20} {'torch GB/s':>20} "
        f"{'ratio':>6} {'of peak':>7}",
    ]
    for c in result["configs"]:
        for way in _ways(c):
            f = c[way]
            peak = f["connector_gbps"]["median"] / link[f"{way[:3]}_gbps"]["median"]
            lines.append(
                f"{_name(c):38} {way:10} {_g(f['connector_gbps']):>20} {_g(f['torch_gbps']):>20} "
                f"{f['ratio']['median']:5.2f}x {peak:6.0%}"
            )
    lines.append(f"{'round trips (store / retrieve GB/s)':38} {'cpu://':>30} {'file://':>30}")
    for c in result["configs"]:
        trips = c["round_trips"]
        cells = [
            f"{_g(trips[t]['store_gbps'], 1)} / {_g(trips[t]['retrieve_gbps'], 1)}"
            for t in ("cpu", "file")
        ]
        lines.append(f"{_name(c):38} {cells[0]:>30} {cells[1]:>30}")
    lines.append(f"{'matmul alone / with transfer (ms)':38}")
    for c in result["configs"]:
        o = c["overlap"]
        lines.append(
            f"{_name(c):38} {o['alone_ms']['median']:8.2f} / {o['with_transfer_ms']['median']:8.2f}"
            f"  slowdown {o['slowdown']:+.1%}  transfer still running: {all(o['covered'])}"
            + (f"  (PyTorch's copy: {o['torch_slowdown']:+.1%})" if "torch_slowdown" in o else "")
        )
    if result["meta"]["device"] == "cpu":
        lines.append("on CPU: the same code on small shapes; the targets are about GPUs")
    for v in result["targets"]:
        mark = "meets " if v["ok"] else "MISSES"
        lines.append(f"  {mark} {v['name']}: {v['figure']:.3f} (target {v['target']})")
    bad = result["byte_mismatches"]
    lines.append("byte-identical: every round trip" if not bad else f"BYTES DIFFER: {bad}")
    return "\n".join(lines)


def render_md(results: Path) -> str:
    """docs/benchmarks.md's GPU table: the newest ``gpu/check-cuda-*.json``."""
    paths = sorted((results / "gpu").glob("check-cuda-*.json"))
    if not paths:
        return "_No GPU run recorded yet._"
    path = paths[-1]
    r = json.loads(path.read_text())
    meta, link = r["meta"], r["link_peak"]
    rows = []
    for c in r["configs"]:
        cells = [_ratio(c[w]["ratio"]) if w in c else "" for w in WAYS]
        o = c["overlap"]
        ref = f"{o['torch_slowdown']:+.1%}" if "torch_slowdown" in o else ""
        rows.append([_name(c), *cells, f"{o['slowdown']:+.1%}", ref])
    head = ("configuration", *(_WAY_HEADS[w] for w in WAYS), "matmul slowdown",
            "beside PyTorch's copy")  # fmt: skip
    text = table(head, rows, "l" + "r" * (len(head) - 1))
    kv = r["kv_bench"]["tiers"]["cpu"]
    return (
        f"{text}\n\nRatios: the connector's copy over PyTorch's pinned `copy_` of the same bytes "
        f"in the same round (median and min-max of {r['plan']['rounds']} rounds; target >= "
        f"{COPY_RATIO_TARGET}x); matmul slowdown (target <= {SLOWDOWN_TARGET:.0%}): a matmul "
        f"timed alone and beside the connector's copies out and in, and beside PyTorch's copy "
        f"of the same bytes out and in, repeated for as long. Link peak "
        f"(PyTorch, {link['bytes'] >> 20} MiB pinned): d2h {_g(link['d2h_gbps'], 1)}, h2d "
        f"{_g(link['h2d_gbps'], 1)} GB/s. `KVCache` store / retrieve of CUDA tensors through the "
        f"pinned `cpu://` tier: {kv['store_ratio']:.2f}x / {kv['retrieve_ratio']:.2f}x of "
        f"PyTorch's copy. Every round trip byte-identical: "
        f"{'yes' if not r['byte_mismatches'] else 'NO'}.\n\nMeasured {meta['utc'][:10]} on "
        f"{meta['device_name']} (torch {meta['torch']}, CUDA {meta['cuda']}) at commit "
        f"`{meta['git_commit'][:7]}` with `python benchmarks/gpu/check.py --device cuda` "
        f"(`benchmarks/results/gpu/{path.name}`)."
    )


def _ratio(s: dict[str, Any]) -> str:
    return f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"


_WAY_HEADS = {
    "d2h": "copy-out, end of step",
    "d2h_layers": "copy-out, per layer",
    "h2d": "load, async",
    "h2d_layers": "load, per layer",
}


def _verdict(name: str, figure: float, target: str, ok: bool) -> dict[str, Any]:
    return {"name": name, "figure": figure, "target": target, "ok": ok}


def _ways(c: dict[str, Any]) -> list[str]:
    """The copies a configuration was timed with ("_layers": one submission per layer, as
    layer pipelining runs them; results before it have only the others)."""
    return [w for w in WAYS if w in c]


def _name(c: dict[str, Any]) -> str:
    return f"{c['shape']} {c['dtype']} {c['layout']}"


def _g(s: dict[str, Any], digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"
