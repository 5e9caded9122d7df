"""The ``kvstack bench vllm`` renderers on small synthetic results, and the overhead interval."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest

from kvstack.bench import results
from kvstack.bench.micro.vllm_paired import median_interval
from kvstack.bench.micro.vllm_report import headline, render, render_scenarios

CROSS = "**kvstack, another instance (shared file tier)**"


@pytest.fixture(autouse=True)
def _no_machine_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results, "machine_facts", lambda: {"cpu_model": "test CPU", "cores": 2})


def _ttft(cross_s: float = 1.6, prompt_tokens: int = 8192) -> dict[str, Any]:
    return {
        "scenario": "ttft", "prompt_tokens": prompt_tokens, "reps": 3,
        "model": "toy-llama-150m-abc", "args": {"quick": False, "seed": 0, "skip": []},
        "cold_s": 36.0, "vllm_prefix_hit_s": 1.1, "kvstack_cold_s": 36.5,
        "kvstack_cpu_hit_s": 1.2, "cross_instance_storing_engine": "stopped",
        "kvstack_cross_instance_s": cross_s, "kvstack_disk_restart_s": 1.15,
        "samples_s": {"cold_s": [35.0, 36.0, 37.0]},
        "example_connector": {"failed": [{"prompt_tokens": 8192, "error": "RuntimeError('x')"}]},
    }  # fmt: skip


def _overhead(ratios: list[float]) -> dict[str, Any]:
    ratio = {
        "median": sorted(ratios)[len(ratios) // 2], "min": min(ratios), "max": max(ratios),
        "n": len(ratios), "interval95": median_interval(ratios),
    }  # fmt: skip
    ttft = {"median": 3.0, "min": 2.9, "max": 3.2, "n": len(ratios)}
    return {
        "scenario": "overhead", "rounds": len(ratios), "prompt_tokens": 1024,
        "plain_vllm": {"ttft_s": ttft},
        "kvstack": {"ttft_s": ttft, "ratio_to_plain_vllm": ratio},
    }  # fmt: skip


def _save(root: Path, name: str, result: dict[str, Any], argv: list[str]) -> None:
    results.save("vllm", argv, result, path=root / "vllm" / name, quiet=True)


def _overhead_rows(text: str) -> list[str]:
    return [
        line for line in text.splitlines() if "overhead" in line or "kvstack (defaults)" in line
    ]


def test_median_interval_takes_the_binomial_order_statistics() -> None:
    assert median_interval([1.0] * 5) is None  # 2 * (1/2)^5 > 5%: no 95% interval exists
    six = median_interval([6.0, 1.0, 5.0, 2.0, 4.0, 3.0])
    assert six is not None and (six["low"], six["high"], six["k"]) == (1.0, 6.0, 1)
    forty = median_interval([float(i) for i in range(1, 41)])
    assert forty is not None and (forty["low"], forty["high"]) == (14.0, 27.0)
    assert forty["coverage"] >= 0.95
    # the exact coverage: P(x(k) <= median <= x(n+1-k)) = 1 - 2 P(Binomial(40, 1/2) <= 13)
    below = sum(math.comb(40, j) for j in range(14)) / 2**40
    assert forty["coverage"] == pytest.approx(1 - 2 * below)


def test_overhead_is_met_only_when_the_intervals_upper_end_is_within_five_percent(
    tmp_path: Path,
) -> None:
    tight = [1.0 + 0.001 * (i % 7) for i in range(40)]  # median +0.3%, interval within +0.6%
    _save(tmp_path, "vllm-overhead-2026-12-01.json", _overhead(tight), ["--scenario", "overhead"])
    assert "≤ 5%: met" in render(tmp_path)
    assert "≤ 5%: met" in headline(tmp_path)[-1][1]
    assert "≤ 5%: met" in render_scenarios(tmp_path)


def test_a_small_median_with_an_upper_end_past_five_percent_is_not_met(tmp_path: Path) -> None:
    # median +1%, but half the rounds spread to +12%: the interval's upper end is past +5%
    wide = [v for v, _ in zip(itertools.cycle([0.9, 0.95, 1.01, 1.08, 1.12]), range(40))]
    ci = median_interval(wide)
    assert ci is not None and ci["low"] < 1.05 < ci["high"]
    _save(tmp_path, "vllm-overhead-2026-12-01.json", _overhead(wide), ["--scenario", "overhead"])
    for text in (render(tmp_path), render_scenarios(tmp_path), headline(tmp_path)[-1][1]):
        assert "≤ 5%: met" not in text
        assert "≤ 5%: **missed** (not shown: the interval reaches +8.0%)" in text


def test_too_few_rounds_for_an_interval_claim_nothing(tmp_path: Path) -> None:
    _save(tmp_path, "vllm-overhead-2026-12-01.json", _overhead([1.0, 1.01, 0.99]), [])
    text = render(tmp_path)
    assert "≤ 5%: met" not in text and "too few rounds" in text


def test_the_ttft_table_reads_the_default_run_not_a_scenario_file(tmp_path: Path) -> None:
    _save(tmp_path, "vllm-2026-12-01.json", _ttft(cross_s=1.6), [])
    _save(tmp_path, "vllm-overhead-2026-12-01.json", _overhead([1.0] * 8), ["--scenario", "x"])
    text = render(tmp_path)
    cross = next(line for line in text.splitlines() if line.startswith(f"| {CROSS}"))
    assert "1.60 s" in cross and "1.45×" in cross and "1/22.5" in cross
    assert "≤ 1.5× vLLM's hit: met; ≤ 1/20 of cold: met" in cross
    assert "35.0–37.0 s" in text  # the spread of the samples
    assert "after the engine that stored the chunks stopped" in text
    assert "shorter prompt" not in text
    assert "Measured" in text and "`kvstack bench vllm`" in text


def test_a_slow_cross_instance_hit_is_missed_and_a_shorter_prompt_is_said(tmp_path: Path) -> None:
    _save(tmp_path, "vllm-2026-12-01.json", _ttft(cross_s=1.7, prompt_tokens=4096), [])
    text = render(tmp_path)
    cross = next(line for line in text.splitlines() if line.startswith(f"| {CROSS}"))
    assert "≤ 1.5× vLLM's hit: **missed**; ≤ 1/20 of cold: met" in cross
    assert "a shorter prompt than the 8,192 tokens" in text
    assert "without a committed result" not in text
    assert "overhead" in text and "not shown" in text  # no overhead result: no claim
    rows = headline(tmp_path)
    assert [row[0].split(" ")[0:2] for row in rows] == [
        ["vLLM", "TTFT,"], ["kvstack", "hit"], ["kvstack", "disk"]
    ]  # fmt: skip


def test_a_busy_machine_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _save(tmp_path, "vllm-2026-12-01.json", _ttft(), [])
    assert "1-minute load average" not in render(tmp_path)
    monkeypatch.setattr(results, "machine_facts", lambda: {"cores": 2, "load_average": 6.5})
    _save(tmp_path / "busy", "vllm-2026-12-01.json", _ttft(), [])
    assert "The 1-minute load average was 6.5 on 2 cores" in render(tmp_path / "busy")


def test_scenarios_render_whichever_have_results(tmp_path: Path) -> None:
    assert "No committed result" in render_scenarios(tmp_path)
    spread = {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    preemption = {
        "scenario": "preemption", "blocks": 48, "reps": 3, "requests": 4,
        "kvstack": {k: spread for k in
                    ("recomputed_tokens", "recovered_tokens", "preemptions", "wall_s")},
    }  # fmt: skip
    _save(tmp_path, "vllm-preemption-2026-12-01.json", preemption, ["--scenario", "preemption"])
    text = render_scenarios(tmp_path)
    assert "**Preemption" in text and "Interference" not in text
    assert "| kvstack | 2 (1–3) | 2 (1–3) | 2 (1–3) | 2.00 s (1.00–3.00 s) |" in text


def test_interference_sets_async_loads_beside_vllms_own_hit(tmp_path: Path) -> None:
    def s(median: float) -> dict[str, float]:
        return {"median": median, "min": median, "max": median, "n": 3}

    def arm(ttft: float, during: float, in_flight: float | None = None) -> dict[str, Any]:
        a = {
            "ttft_s": s(ttft), "quiet_p50_ms": s(50.0), "quiet_p99_ms": s(55.0),
            "loading_p50_ms": s(52.0), "loading_p99_ms": s(during),
            "p99_ratio": s(during / 55.0), "errors": [], "itl_source": "engine",
        }  # fmt: skip
        if in_flight is not None:
            a["in_flight_p99_ratio"] = s(in_flight / 55.0)
        return a

    res = {
        "scenario": "interference", "prefix_tokens": 8192, "rounds": 3,
        "recompute": arm(26.0, 9000.0), "vllm-hit": arm(0.2, 160.0),
        "file/sync": arm(0.7, 680.0), "file/async": arm(0.46, 160.0, 60.5),
    }  # fmt: skip
    # Each of the four decodes makes one token a step: 28, 32 and 36 tokens are 7, 8, 9 steps.
    res["file/async"]["rounds"] = [{"loading": {"samples": n}} for n in (32.0, 28.0, 36.0)]
    text, row = _rendered(tmp_path / "apart", res, "file/async")
    hit_row = next(line for line in text.splitlines() if line.startswith("| vllm-hit |"))
    assert "2.91×" in hit_row  # its own window's p99 over before, judged by no bar
    assert "1.10×" in row  # in flight: 60.5 / 55
    assert "| 8 (7–9) |" in row  # engine steps while the loader waited, from the decodes' tokens
    assert "ITL p99 ≤ 1.25× before: **missed**" in row  # the bar, on the whole window as written
    assert "ITL p99 during 1.00× vLLM's own hit's" in row
    assert "TTFT 0.66× sync's, ≤ 1.1×" in row  # arms on their own engines: medians compared
    # where both engines timed their loaders, their medians, not the clients' (which hold the
    # HTTP server's stalls)
    res["file/async"]["engine_ttft_s"] = s(0.060)
    res["file/sync"]["engine_ttft_s"] = s(0.040)
    _, timed = _rendered(tmp_path / "engine-medians", res, "file/async")
    assert "TTFT 1.50× sync's as the engines timed it, ≤ 1.1×: **missed**" in timed
    del res["file/async"]["engine_ttft_s"], res["file/sync"]["engine_ttft_s"]
    assert "Each arm ran on its own engine" in text
    assert "`/metrics`, scraped every 50 ms" in text  # results from before --poll-s
    assert "loads an 8,192-token prefix" in text

    assert "load_finish_wait" not in text  # the wait was off: nothing said
    # without scrapes during the rounds (--poll-s 0), no in-flight window is claimed
    res["args"] = {"poll_s": 0.0, "finish_wait": 0.25}
    text, _ = _rendered(tmp_path / "unpolled", res, "file/async")
    assert 'there is no "in flight" window' in text and "scraped every" not in text
    assert "ran with `load_finish_wait: 0.25`" in text and "readers=" not in text
    res["args"]["file_readers"] = 1
    text, _ = _rendered(tmp_path / "one-reader", res, "file/async")
    assert "read with `readers=1`" in text and "load_fetch" not in text
    res["args"]["load_fetch"] = "process"
    text, _ = _rendered(tmp_path / "helper", res, "file/async")
    assert "ran with `load_fetch: process`" in text
    del res["args"]

    # the connector's own step timing: the in-flight column without scrapes during a load
    res["args"] = {"poll_s": 0.0}
    res["file/async"] |= {
        "steps_in_flight_p99_ratio": {"median": 1.3, "min": 1.1, "max": 2.0, "n": 2},
        "steps_in_flight_rounds": 2,
    }
    text, row = _rendered(tmp_path / "connector-timed", res, "file/async")
    assert row.split("|")[6].strip() == "1.30× (1.10×–2.00×)"  # not the polled 1.10×
    assert (
        "decode steps while the load was in flight 1.30× before, timed by the connector "
        "(2 rounds)" in row
    )
    assert "timed by the connector's scheduler side" in text and 'no "in flight"' not in text
    assert "ITL p99 ≤ 1.25× before: **missed**" in row  # the bar stays on the whole window
    del res["args"], res["file/async"]["steps_in_flight_p99_ratio"]
    del res["file/async"]["steps_in_flight_rounds"]

    # sync and async sharing one engine: the ratio of each pair of rounds, and its spread
    res["file/async"]["ttft_vs_sync"] = {"median": 1.08, "min": 0.9, "max": 1.3, "n": 3}
    text, row = _rendered(tmp_path / "paired", res, "file/async")
    assert "TTFT 1.08× sync's, pair by pair (0.90×–1.30×), ≤ 1.1×" in row
    assert "share one engine, their rounds alternating" in text

    # and where the engine timed each loader: its ratios set the target, the client's beside
    res["file/async"]["engine_ttft_vs_sync"] = {"median": 1.2, "min": 1.0, "max": 1.5, "n": 3}
    _, row = _rendered(tmp_path / "engine", res, "file/async")
    assert ("TTFT 1.20× sync's as the engine timed it, pair by pair (1.00×–1.50×; the "
            "client's 1.08×), ≤ 1.1×: **missed**") in row  # fmt: skip


def _rendered(results: Path, res: dict[str, Any], arm: str) -> tuple[str, str]:
    """An interference result saved under ``results`` and rendered: the text, ``arm``'s row."""
    _save(results, "vllm-interference-2026-12-03.json", res, ["--scenario", "interference"])
    text = render_scenarios(results)
    return text, next(line for line in text.splitlines() if line.startswith(f"| {arm} |"))


def test_settle_waits_while_the_machine_is_busy_and_not_after() -> None:
    """The paired rounds' settling on the real ``/proc/stat``: every CPU spinning for a second
    holds it back; an idle machine lets it go after one window."""
    import os
    import subprocess
    import sys
    import time

    from kvstack.bench.micro.vllm_paired import settle

    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat")
    spin = "import time\nend = time.time() + 1.0\nwhile time.time() < end: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 1)]
    time.sleep(0.2)  # they are spinning
    try:
        waited = settle(busy=0.5, window_s=0.1, timeout_s=10.0)
    finally:
        for p in spinners:
            p.wait()
    assert 0.6 <= waited < 10.0
    assert settle(busy=0.95, window_s=0.1, timeout_s=10.0) < 1.0
