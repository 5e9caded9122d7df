"""The GPU check's verdicts and table: targets judged from :func:`.gpu_check.run_check`'s dict.

Targets (the issue's, on a GPU): the connector's copy-out and load at least 0.8x PyTorch's
pinned copy of the same bytes (median of the per-round ratios), and a matmul slowed by at most
10% while transfers run. Byte identity is not a target but a requirement: :func:`failures`
lists every round trip or copy whose bytes did not come back, and the script exits non-zero.
On CPU the figures are the same code's, but not what the targets are about.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COPY_RATIO_TARGET", "SLOWDOWN_TARGET", "failures", "format_table", "targets"]

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
        )
    if result["meta"]["device"] == "cpu":
        lines.append("on CPU: the same code on small shapes; the targets are about GPUs")
    for v in result["targets"]:
        mark = "meets " if v["ok"] else "MISSES"
        lines.append(f"  {mark} {v['name']}: {v['figure']:.3f} (target {v['target']})")
    bad = result["byte_mismatches"]
    lines.append("byte-identical: every round trip" if not bad else f"BYTES DIFFER: {bad}")
    return "\n".join(lines)


def _verdict(name: str, figure: float, target: str, ok: bool) -> dict[str, Any]:
    return {"name": name, "figure": figure, "target": target, "ok": ok}


def _ways(c: dict[str, Any]) -> list[str]:
    """The copies a configuration was timed with ("_layers": one submission per layer, as
    layer pipelining runs them; results before it have only the others)."""
    return [w for w in ("d2h", "d2h_layers", "h2d", "h2d_layers") if w in c]


def _name(c: dict[str, Any]) -> str:
    return f"{c['shape']} {c['dtype']} {c['layout']}"


def _g(s: dict[str, Any], digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"
