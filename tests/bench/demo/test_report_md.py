"""The demo's published tables, from a committed demo.json: targets say met or missed."""

from __future__ import annotations

from pathlib import Path

from kvstack.bench.demo import report_md
from kvstack.bench.results import save


def _story(cold: float, other: float, restart: float) -> dict[str, object]:
    return {"cold_ttft_s": cold, "other_instance_ttft_s": other,
            "other_instance_without_kvstack_ttft_s": cold, "after_restart_ttft_s": restart,
            "identical_tokens": True}  # fmt: skip


def _row(mode: str, p50: float, requests: int = 32) -> dict[str, object]:
    return {"workload": "long-doc-qa", "mode": mode, "requests": requests, "errors": 0,
            "ttft_p50_s": p50, "ttft_p90_s": p50 * 2, "output_tokens_per_s": 5.0,
            "cache_hit_rate": 0.5}  # fmt: skip


def _write(
    root: Path, kind: str, story: dict[str, object], load: list[object], wall: float
) -> None:
    body = {"story": story, "story_details": {"document_tokens": 4096, "control_differs": True},
            "load": load, "wall_s": wall}  # fmt: skip
    save("demo", ["--quick"] if kind == "quick" else [], body,
         root / "demo" / f"demo-{kind}-2026-12-01.json", prog=["kvstack", "demo"], quiet=True,
         flat=True)  # fmt: skip


def test_met_and_missed_story_bars_and_load_rows(tmp_path: Path) -> None:
    _write(tmp_path, "full", _story(10.0, 1.2, 0.4), [_row("off", 2.0), _row("on", 1.0)], 300.0)
    text = report_md.render(tmp_path)
    assert "(A stopped) | 1.20 s | 0.120× | ≤ 0.1× cold: **missed** |" in text
    assert (
        "| 4. after both engines restart, from disk | 0.40 s | 0.040× | ≤ 0.1× cold: met |" in text
    )
    assert "p50 below off's, ≥ 30 requests: met" in text
    assert "5 min 0 s (target < 6 min): met" in text
    ((what, figure, command),) = report_md.headline(tmp_path)
    assert (
        "4,096-token" in what and "1.20 s / 0.40 s" in figure and command == "`./scripts/demo.sh`"
    )


def test_a_losing_or_small_load_row_is_missed(tmp_path: Path) -> None:
    _write(tmp_path, "full", _story(10.0, 0.5, 0.4),
           [_row("off", 1.0), _row("on", 1.1), ], 400.0)  # fmt: skip
    text = report_md.render(tmp_path)
    assert "p50 below off's, ≥ 30 requests: **missed**" in text
    assert "(target < 6 min): **missed**" in text
    _write(tmp_path, "full", _story(10.0, 0.5, 0.4), [_row("off", 2.0, 10), _row("on", 1.0, 10)],
           100.0)  # fmt: skip
    assert "≥ 30 requests: **missed**" in report_md.render(tmp_path)


def test_no_result_says_so(tmp_path: Path) -> None:
    assert "No committed demo result" in report_md.render(tmp_path)
    assert report_md.headline(tmp_path) == []
