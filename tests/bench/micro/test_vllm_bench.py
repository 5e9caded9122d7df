"""``kvstack bench vllm``: the order its engines run in, and a quick scenario on real engines."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstack.bench import results
from kvstack.bench.micro import vllm
from kvstack.bench.micro.vllm_report import render, render_scenarios


@pytest.fixture
def no_machine_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results, "machine_facts", lambda: {"cpu_model": "test CPU", "cores": 2})


def test_the_cross_instance_engine_starts_after_the_storing_one_stopped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_machine_probe: None
) -> None:
    running: set[str] = set()
    beside: dict[str, set[str]] = {}  # engine -> the engines running when it started

    @contextlib.contextmanager
    def engine(self: vllm.Bench, name: str, kv: Any, prefix_caching: bool = True) -> Iterator[str]:
        beside[name] = set(running)
        running.add(name)
        try:
            yield name
        finally:
            running.discard(name)

    monkeypatch.setattr(vllm.Bench, "engine", engine)
    monkeypatch.setattr(vllm, "ttft", lambda server, prompt: 1.0)
    monkeypatch.setattr(vllm, "reset_prefix_cache", lambda server: None)
    monkeypatch.setattr(vllm, "build_toy_model", lambda spec: tmp_path / "toy-llama-x")
    out = tmp_path / "results" / "vllm" / "vllm-1.json"
    argv = ["--quick", "--skip", "example", "--work-dir", str(tmp_path), "--json", str(out)]
    assert vllm.run(argv) == 0
    assert "kvstack-a" in beside and beside["kvstack-b"] == set()
    saved = results.load(out)
    assert saved.command == "kvstack bench vllm " + " ".join(argv)
    assert saved.result["cross_instance_storing_engine"] == "stopped"
    assert saved.result["samples_s"]["kvstack_cross_instance_s"] == [1.0]
    assert not any("overhead" in key for key in saved.result)  # no unpaired overhead any more
    assert "≤ 5%: met" not in render(tmp_path / "results")


@pytest.mark.vllm
def test_the_overhead_scenario_on_real_engines_saves_what_the_report_renders(
    tmp_path: Path, no_machine_probe: None
) -> None:
    out = tmp_path / "results" / "vllm" / "vllm-overhead-1.json"
    argv = ["--scenario", "overhead", "--quick", "--prompt-tokens", "1024"]
    assert vllm.run([*argv, "--work-dir", str(tmp_path / "work"), "--json", str(out)]) == 0
    res = results.load(out).result
    assert res["scenario"] == "overhead" and res["rounds"] == vllm.PAIRED_ROUNDS_QUICK
    assert all(len(s) == vllm.PAIRED_ROUNDS_QUICK for s in res["samples_s"].values())
    ratio = res["kvstack"]["ratio_to_plain_vllm"]
    assert ratio["interval95"]["low"] <= ratio["median"] <= ratio["interval95"]["high"]
    assert res["connector"]["kvstack"]["save_seconds_total"] > 0  # it stored what it computed
    text = render_scenarios(tmp_path / "results")
    assert "**Overhead" in text and f"{vllm.PAIRED_ROUNDS_QUICK} paired rounds" in text


def test_the_overhead_scenario_rotates_its_arms_and_saves_an_interval(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_machine_probe: None
) -> None:
    from kvstack.bench.micro import vllm_harness, vllm_paired

    order: list[str] = []

    @contextlib.contextmanager
    def engines(self: vllm_harness.Engines, arms: dict[str, Any]) -> Iterator[dict[str, str]]:
        yield {name: name for name in arms}

    def stream_ttft(server: str, prompt: list[int]) -> float:
        order.append(server)
        return {"plain_vllm": 1.0, "kvstack": 1.02}.get(server, 1.01)

    monkeypatch.setattr(vllm_harness.Engines, "engines", engines)
    monkeypatch.setattr(vllm_paired, "stream_ttft", stream_ttft)
    monkeypatch.setattr(vllm_paired, "metric_value", lambda server, name: 1.0)
    monkeypatch.setattr(vllm_paired.time, "sleep", lambda s: None)
    monkeypatch.setattr(vllm, "build_toy_model", lambda spec: tmp_path / "toy-llama-x")
    out = tmp_path / "results" / "vllm" / "vllm-overhead-1.json"
    assert vllm.run(["--scenario", "overhead", "--quick", "--json", str(out)]) == 0
    rounds = [order[i : i + 2] for i in range(2, len(order), 2)]  # after two warm-ups
    assert rounds == [["plain_vllm", "kvstack"], ["kvstack", "plain_vllm"]] * 3
    res = results.load(out).result
    ci = res["kvstack"]["ratio_to_plain_vllm"]["interval95"]
    assert ci["low"] == ci["high"] == pytest.approx(1.02) and ci["k"] == 1
    assert res["args"]["reps"] == vllm.PAIRED_ROUNDS_QUICK
    assert "≤ 5%: met" in render(tmp_path / "results")


def test_the_preemption_engines_have_a_model_length_their_blocks_can_hold(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # vLLM refuses to start an engine whose blocks cannot hold one request of max_model_len
    # (the scenario's default 16,384 against 48 blocks of 128 tokens did exactly that).
    from kvstack.bench.micro import vllm_harness, vllm_turns
    from kvstack.bench.micro.vllm_probe import PromptFactory

    lengths: list[int] = []

    @contextlib.contextmanager
    def engine(self: vllm_harness.Engines, name: str, kv: Any, **_: Any) -> Iterator[str]:
        lengths.append(self.max_model_len)
        yield name

    monkeypatch.setattr(vllm_harness.Engines, "engine", engine)
    monkeypatch.setattr(vllm_turns, "_preempt_round", lambda e, batch: dict.fromkeys(
        ("recomputed_tokens", "recovered_tokens", "preemptions", "wall_s"), 1.0))  # fmt: skip
    engines = vllm_harness.Engines(tmp_path / "model", tmp_path, max_model_len=16384)
    out = vllm_turns.preemption(engines, PromptFactory(seed=0), blocks=48, reps=1)
    assert lengths == [3000] * 3  # 1,000 prompt + 2,000 generated tokens, not 16,384
    assert out["plain_vllm"]["preemptions"]["median"] == 1.0
    with pytest.raises(ValueError, match="--preempt-blocks 20 holds 2,560 tokens"):
        vllm_turns.preemption(engines, PromptFactory(seed=0), blocks=20, reps=1)


def test_engine_itl_percentiles_come_from_the_histogram_difference() -> None:
    from kvstack.bench.micro.vllm_harness import fine_itl_buckets, histogram_itl

    bounds = fine_itl_buckets()
    assert bounds == sorted(set(bounds)) and bounds[0] == 0.0005 and bounds[-1] == 60.0

    def cumulative(samples: list[float]) -> dict[float, float]:
        counts = {b: float(sum(1 for s in samples if s <= b)) for b in bounds}
        counts[float("inf")] = float(len(samples))
        return counts

    before_window = [0.012] * 50  # observed before the window: must not count
    window = [0.0101] * 98 + [0.250, 0.900]  # 98 steps of ~10 ms, a 250 ms and a 900 ms stall
    before, after = cumulative(before_window), cumulative(before_window + window)
    got = histogram_itl(before, after)
    assert got["samples"] == 100
    assert 10.0 <= got["p50_ms"] <= 10.5  # in the 10.0-10.5 ms bucket
    assert 240.0 <= got["p99_ms"] <= 260.0  # the 99th of 100 is the 250 ms stall
    # Nothing observed in the window: no figure, not a zero.
    empty = histogram_itl(after, after)
    assert empty["samples"] == 0 and empty["p99_ms"] != empty["p99_ms"]  # NaN


def test_the_in_flight_window_ends_at_the_first_scrape_that_counts_the_load_done() -> None:
    """The interference scenario's ``_poll`` on a real HTTP ``/metrics`` whose histogram and
    finished-load count change between scrapes, as an engine's do."""
    import http.server
    import threading
    import time
    from types import SimpleNamespace

    from kvstack.bench.micro import vllm_interference as interference
    from kvstack.bench.micro.vllm_harness import ITL_METRIC

    scrapes: list[float] = []

    def text(n: int) -> str:
        done = 1 if n >= 3 else 0  # the load is counted finished from the fourth scrape on
        lines = [f"# TYPE {ITL_METRIC} histogram"]
        lines += [
            f'{ITL_METRIC}_bucket{{le="0.05"}} {10 * n}',
            f'{ITL_METRIC}_bucket{{le="+Inf"}} {10 * n}',
        ]
        lines += [f"{ITL_METRIC}_count {10 * n}", f"{ITL_METRIC}_sum {0.5 * n}"]
        lines += ["# TYPE kvstack_connector_async_load_seconds histogram"]
        lines += [f"{interference.LOADS_DONE} {done}"]
        return "\n".join(lines) + "\n"

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = text(len(scrapes)).encode()
            scrapes.append(time.monotonic())
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    engine = SimpleNamespace(url=f"http://127.0.0.1:{server.server_address[1]}")
    try:

        def work() -> str:  # runs until the poller has scraped six times (a loaded CI is slow)
            deadline = time.monotonic() + 30
            while len(scrapes) < 6:
                assert time.monotonic() < deadline, f"only {len(scrapes)} scrapes in 30 s"
                time.sleep(0.01)
            return "token"

        got, landed = interference._poll(engine, work, 0.0, 0.05)  # type: ignore[arg-type]
        assert got == "token"
        assert landed == {0.05: 30.0, float("inf"): 30.0}  # the fourth scrape's histogram
        _, none = interference._poll(engine, lambda: time.sleep(0.1), None)  # type: ignore[arg-type]
        assert none is None
        with pytest.raises(RuntimeError, match="the stream broke"):
            interference._poll(engine, _broken)  # type: ignore[arg-type]
        scraped = len(scrapes)  # polling off (the default): the work alone, no scrape
        assert interference._poll(engine, lambda: "x", 0.0, 0.0) == ("x", None)  # type: ignore[arg-type]
        assert len(scrapes) == scraped
    finally:
        server.shutdown()


def _broken() -> None:
    raise RuntimeError("the stream broke")


def test_the_load_breakdown_is_the_mean_of_each_timing_and_none_without_loads() -> None:
    from kvstack.bench.micro.vllm_interference import _load_breakdown

    text = "\n".join([
        "# TYPE kvstack_connector_async_fetch_seconds histogram",
        'kvstack_connector_async_fetch_seconds_sum{model_name="m"} 0.9',
        'kvstack_connector_async_fetch_seconds_count{model_name="m"} 3',
        "# TYPE kvstack_connector_async_load_seconds histogram",
        'kvstack_connector_async_load_seconds_sum{model_name="m"} 1.2',
        'kvstack_connector_async_load_seconds_count{model_name="m"} 3',
        "# TYPE kvstack_connector_finish_waits counter",
        'kvstack_connector_finish_waits_total{model_name="m"} 2',
        "# TYPE kvstack_connector_finish_wait_seconds histogram",
        'kvstack_connector_finish_wait_seconds_sum{model_name="m"} 0.004',
        'kvstack_connector_finish_wait_seconds_count{model_name="m"} 2',
    ]) + "\n"  # fmt: skip
    breakdown = _load_breakdown(text)
    assert breakdown == {"step_s_mean": None, "fetch_s_mean": pytest.approx(0.3),
                         "reported_s_mean": pytest.approx(0.4),
                         "finish_wait_s_mean": pytest.approx(0.002),
                         "finish_waits": 2, "finish_wait_caught": 0}  # fmt: skip


def test_the_connector_timed_steps_give_each_async_rounds_in_flight_ratio() -> None:
    """Two scrapes of the connector's step interval histograms, as prometheus_client renders
    them: the in-flight window's percentiles, none where nothing was timed, and the summary
    over the rounds whose load was in flight."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from kvstack.bench.micro import vllm_interference as bench

    registry = CollectorRegistry()
    buckets = [n * 0.0005 for n in range(1, 41)]
    quiet, loading = (
        Histogram(name.removeprefix("kvstack_connector_"), "", ["model_name"], buckets=buckets,
                  namespace="kvstack_connector", registry=registry).labels("m")
        for name in (bench.QUIET_STEPS, bench.LOADING_STEPS)
    )  # fmt: skip
    for _ in range(10):
        quiet.observe(0.005)
    before = generate_latest(registry).decode()
    for seconds in (0.006, 0.006, 0.009):
        loading.observe(seconds)
    after = generate_latest(registry).decode()
    timed = bench._steps_timed(before, after, bench.LOADING_STEPS)
    assert timed is not None and timed["samples"] == 3 and 8.5 <= timed["p99_ms"] <= 9.0
    assert bench._steps_timed(before, after, bench.QUIET_STEPS) is None  # none in the window
    assert bench._steps_timed("", "", bench.LOADING_STEPS) is None  # plain vLLM: no connector

    def round_(in_flight_ms: float | None) -> dict[str, Any]:
        window = {"p50_ms": 5.0, "p99_ms": 5.0, "samples": 10.0}
        return {
            "ttft_s": 0.05, "quiet": window, "loading": window, "in_flight": None,
            "client_quiet": window, "client_loading": window, "steps_quiet": window,
            "steps_in_flight": None if in_flight_ms is None
            else {"p50_ms": in_flight_ms, "p99_ms": in_flight_ms, "samples": 2.0},
        }  # fmt: skip

    summary = bench._summary([round_(6.0), round_(None), round_(9.0)], [])
    assert summary["steps_in_flight_rounds"] == 2  # the round whose load ran in the step: none
    assert summary["steps_in_flight_p99_ratio"]["median"] == pytest.approx(1.5)
    assert summary["steps_in_flight_p99_ratio"]["max"] == pytest.approx(1.8)
    assert "steps_in_flight_p99_ratio" not in bench._summary([round_(None)], [])


def _finished(count: int, queue_s: float, prefill_s: float) -> str:
    """A scrape holding vLLM's per-request queue and prefill time histograms."""
    lines = []
    for name, total in (("queue", queue_s), ("prefill", prefill_s)):
        metric = f"vllm:request_{name}_time_seconds"
        lines += [f"# TYPE {metric} histogram", f'{metric}_count{{engine="0"}} {count}',
                  f'{metric}_sum{{engine="0"}} {total}']  # fmt: skip
    return "\n".join(lines) + "\n"


def test_the_engine_ttft_is_the_one_finished_requests_queue_and_prefill_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The frontend counts a finished request a moment after its stream ends: the scrape is
    retried until it does; where two requests finished (a decode ended too) there is none."""
    from kvstack.bench.micro import vllm_interference as interference

    before = _finished(3, 1.0, 2.0)
    scrapes = iter([before, before, _finished(4, 1.25, 2.5)])
    monkeypatch.setattr(interference, "scrape", lambda engine: next(scrapes))
    monkeypatch.setattr(interference, "POLL_S", 0.0)
    after, ttft = interference._engine_ttft(None, before)  # type: ignore[arg-type]
    assert ttft == pytest.approx(0.75) and after == _finished(4, 1.25, 2.5)

    monkeypatch.setattr(interference, "scrape", lambda engine: _finished(5, 2.0, 3.0))
    assert interference._engine_ttft(None, before)[1] is None  # type: ignore[arg-type]

    monkeypatch.setattr(interference, "scrape", lambda engine: before)
    monkeypatch.setattr(interference, "FINISHED_WAIT_S", 0.05)
    assert interference._engine_ttft(None, before)[1] is None  # type: ignore[arg-type]


def test_paired_ratios_divide_each_async_round_by_the_sync_round_of_its_pair() -> None:
    from kvstack.bench.micro.vllm_interference import _paired_ratios

    sync = [{"ttft_s": 1.0, "engine_ttft_s": 0.1}, {"ttft_s": 9.0, "engine_ttft_s": 0.2},
            {"ttft_s": 2.0, "engine_ttft_s": None}]  # fmt: skip
    asynchronous = [{"ttft_s": 2.0, "engine_ttft_s": 0.12}, {"ttft_s": 3.0, "engine_ttft_s": 0.2},
                    {"ttft_s": 2.0, "engine_ttft_s": 0.3}]  # fmt: skip
    ratios = _paired_ratios(asynchronous, sync)
    assert ratios["ttft_vs_sync"] == {"median": 1.0, "min": pytest.approx(1 / 3), "max": 2.0,
                                      "n": 3}  # fmt: skip
    engine = ratios["engine_ttft_vs_sync"]  # the third pair has no engine timing of its sync
    assert engine["n"] == 2 and engine["min"] == 1.0 and engine["max"] == pytest.approx(1.2)
    assert "engine_ttft_vs_sync" not in _paired_ratios(asynchronous[2:], sync[2:])


def test_a_work_dir_that_does_not_exist_yet_is_created(tmp_path: Path) -> None:
    """The engines' logs and redis-server's ``--dir`` go in it before anything else would."""
    import argparse

    asked = tmp_path / "runs" / "interference"
    assert vllm._work_dir(argparse.Namespace(work_dir=str(asked))) == asked
    assert asked.is_dir()
    fresh = vllm._work_dir(argparse.Namespace(work_dir=None))
    assert fresh.is_dir() and fresh != asked
    fresh.rmdir()


def test_the_interference_finish_wait_goes_to_every_kvstack_arm_and_only_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kvstack.bench.micro import vllm_interference as bench

    configs: dict[str, dict[str, Any] | None] = {}

    class _Engines:
        work, max_model_len = tmp_path, 16384

        @contextlib.contextmanager
        def engine(self, name: str, config: dict[str, Any] | None, args: Any) -> Iterator[str]:
            configs[name] = config
            yield name

    round_ = {"ttft_s": 1.0, "engine_ttft_s": 1.0}
    monkeypatch.setattr(bench, "_redis", lambda work: contextlib.nullcontext("redis://x"))
    monkeypatch.setattr(bench, "_store", lambda *a: None)
    monkeypatch.setattr(bench._Arm, "__call__", lambda self, e, before: {"rounds": [round_]})
    monkeypatch.setattr(
        bench._Arm,
        "paired",
        lambda self, e, before, p: ({"rounds": [round_]}, {"rounds": [round_]}),
    )
    monkeypatch.setattr(bench, "scrape", lambda e: "")
    monkeypatch.setattr(bench, "metric_value", lambda e, name: 0.0)
    monkeypatch.setattr(bench, "completion", lambda *a: None)
    prompts = lambda n: [1] * n  # noqa: E731
    bench.interference(_Engines(), prompts, 512, 1, 0.1, lambda d: 0, 0.0, 0.25)  # type: ignore[arg-type]
    extra = {n: (c or {}).get("kv_connector_extra_config", {}) for n, c in configs.items()}
    kvstack_arms = {"file-paired", "file-auto", "redis-paired", "redis-auto"}
    assert {n for n, e in extra.items() if e.get("load_finish_wait") == 0.25} == kvstack_arms
    configs.clear()
    bench.interference(_Engines(), prompts, 512, 1, 0.1, lambda d: 0, 0.0, 0.0)  # type: ignore[arg-type]
    assert not any("load_finish_wait" in (c or {}).get("kv_connector_extra_config", {})
                   for c in configs.values())  # fmt: skip
    assert not any("readers=" in str(c) for c in configs.values())

    # --file-readers: the file tier's URL on the arms that load from it, and only there
    configs.clear()
    bench.interference(_Engines(), prompts, 512, 1, 0.1, lambda d: 0, 0.0, 0.0, 1)  # type: ignore[arg-type]
    tiers = {n: (c or {}).get("kv_connector_extra_config", {}).get("tiers", [])
             for n, c in configs.items()}  # fmt: skip
    assert {n for n, t in tiers.items() if any(u.endswith("&readers=1") for u in t)} == {
        "file-paired",
        "file-auto",
    }
