"""``kvstack bench vllm --scenario interference``: what a slow-tier load does to the decodes
running beside it.

N requests decode, streamed. One request at a time then arrives whose long prefix
(``--prompt-tokens``, 8K by default) is stored only in a slow tier: the file tier with its chunk
files dropped from the page cache before every load, or Redis. Arms, all in one run, the same
prefixes and decodes:

- ``recompute``: plain vLLM computes the prefix (this arm and the next, each its own engine);
- ``vllm-hit``: plain vLLM with the prefix in its own prefix cache (computed before the rounds):
  what any hit costs the batch, kvstack's or not, since the hit request's own first step (its
  suffix, attending to the whole prefix) runs among the decodes;
- ``<tier>/sync``: the connector loading within the engine step;
- ``<tier>/async``: the connector loading asynchronously (the request waits, the batch does
  not). These two share one engine (``load_mode=async``, ``request_load_mode``: a sync round's
  loader asks ``kv_transfer_params: {"kvstack": {"load_mode": "sync"}}``), their rounds
  alternating and the order flipped every pair, each round its own prefix: the loader's TTFT
  is compared pair by pair (``ttft_vs_sync``, ``engine_ttft_vs_sync``), so that the machine
  drifting over the minutes between two engines does not read as a difference between the
  modes;
- ``<tier>/auto``: the default, ``load_mode=auto``, which picks one of the two by measured cost
  (:mod:`kvstack.integrations.vllm.load_cost`);
- ``no loads``: on every engine, the same decodes in the seconds just before each load.

Every engine first runs one unmeasured round per load mode it serves (:data:`WARM_MODES`).
Per round (one load): the loader's TTFT, as the client saw it and as the engine timed it
(:data:`ENGINE_TTFT`), and the decodes' inter-token latencies while it was in flight (send to
its token) and in the ``--quiet-s`` seconds before. With ``--poll-s``, where the load is
asynchronous, also while it is in flight: from the send to the scrape of ``/metrics`` (every
``--poll-s`` seconds, in the quiet window too) that first counts it finished, before the
request's own first step. The polling is off by default: on a 2-core host one scrape of a
vLLM ``/metrics`` (with the fine ITL buckets) took the API server 45-70 ms, on the core where
the engine core and kvstack's load threads run too, so 20 scrapes a second slowed exactly the
asynchronous arm's fetch, and at 2K prefixes no poll ever caught a load in flight anyway.
``--finish-wait`` sets the connector's opt-in ``load_finish_wait`` on every kvstack arm alike;
each result's load breakdown counts the waits and the loads they caught. ``--file-readers``
sets the file tier's reader threads on its loading arms: each is a Python thread in vLLM's
worker process, beside the forward pass, and takes the GIL between its reads. The
latencies are the engine's own: vLLM's ``vllm:inter_token_latency_seconds`` histogram, given
fine buckets (:func:`~.vllm_harness.fine_itl_buckets`) and read before and after each window,
times every token by the engine core's timestamp of the step that made it. The gaps between
streamed chunks as the client reads them are kept too (``client_*``), but they are not a
measure of the engine: on a fast machine the HTTP stream hands over several tokens in one
read, and those gaps read 0 ms. Reported per arm: medians and min-max over rounds of the
loader's TTFT and of ITL p50/p99, and the ratio of each round's p99 during the load (and in
flight) to its p99 before.

Where the arm has kvstack's connector, the round also reads the connector's own step timing
from the scrapes it takes anyway (:data:`QUIET_STEPS`, :data:`LOADING_STEPS`): the intervals
between steps that both ran a decode while an asynchronous load was in flight, and the same
intervals in the quiet window. Their p99 ratio is the in-flight figure without ``--poll-s``,
and the report shows it where the result has it.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from kvstack.bench.micro.vllm_harness import (
    DecodeStreams,
    Engines,
    completion,
    histogram_itl,
    itl,
    itl_counts,
    itl_engine_args,
    metric_value,
    redis_server,
    scrape,
    spread,
    stream_ttft,
)
from kvstack.bench.micro.vllm_probe import PromptFactory
from kvstack.bench.micro.vllm_report_scenarios import INTERFERENCE_ARMS as ARMS
from kvstack.bench.micro.vllm_report_scenarios import in_flight_key
from kvstack.kv.tiers.file.chunkfile import SUFFIX as CHUNK_FILE_SUFFIX
from kvstack.stack.vllm_server import VLLMServer, connector_config

__all__ = ["interference"]

NUM_DECODES = 4
DECODE_PROMPT_TOKENS = 128
SUFFIX_TOKENS = 16  # the loader's own tokens after its prefix (computed in every arm)
POLL_S = 0.05  # scrape interval waiting for the loader's finish to be counted (after its token)
LOADS_DONE = "kvstack_connector_async_load_seconds_count"  # asynchronous loads finished
# The connector's own step timing (its scheduler side): the interval between two steps that
# both ran a request, a decode's inter-token latency, with and without an asynchronous load in
# flight (planned, not yet reported done). vLLM's ITL histogram cannot split its steps so, and
# scraping it during a load to end the window slows the load on a small host (``--poll-s``);
# these are read from the scrapes the round takes anyway. The loader's own first step, which
# vLLM's own hit costs the decodes too, is not in the in-flight window.
QUIET_STEPS = "kvstack_connector_step_interval_seconds"
LOADING_STEPS = "kvstack_connector_loading_step_interval_seconds"
T = TypeVar("T")
CHUNK_TOKENS = 256
HIT_TOKENS = "kvstack_connector_hit_tokens_total"
SYNC_MODE = {"kv_transfer_params": {"kvstack": {"load_mode": "sync"}}}  # a paired sync round's
STORE_TIMEOUT_S = 120.0
# The loader's TTFT as the engine core timed it: queued (the engine core took the request) to
# scheduled, plus scheduled to the step that made its first token. vLLM observes both when a
# request finishes, and in a round only the loader does. On a 2-core host vLLM's API server
# was seen to stall for seconds while 4 decodes streamed (a plain-vLLM /health taking up to
# 37 s), in every arm alike: the client's TTFT holds those stalls, the engine's does not.
ENGINE_TTFT = ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds")
FINISHED_WAIT_S = 5.0  # for the frontend to count the finished loader after its stream ended
# Each engine's first rounds run before the measured ones and are dropped, one per load mode it
# serves: a fresh engine's first seconds of decodes and loads run several times slower than
# the rest on a small CPU host (a first round's decodes took 9 s to reach their 8th token), and
# that landed on whichever mode happened to go first.
WARM_MODES: tuple[dict[str, Any] | None, ...] = (SYNC_MODE, None)  # None: the engine's own


def interference(
    engines: Engines,
    prompts: PromptFactory,
    prefix_tokens: int,
    rounds: int,
    quiet_s: float,
    drop_page_cache: Callable[[Path], int],
    poll_s: float = 0.0,
    finish_wait: float = 0.0,
    file_readers: int = 0,
    load_fetch: str = "thread",
) -> dict[str, Any]:
    """The scenario's result; ``poll_s``: the in-flight window's scrape interval (0: none);
    ``finish_wait``: every kvstack arm's ``load_finish_wait`` (0: the default, off);
    ``file_readers``: the loading arms' file tier reader threads (0: the tier's default);
    ``load_fetch``: every kvstack arm's ``load_fetch`` (``thread``: the default). The writer
    keeps the defaults: it only stores the prefixes."""
    prefixes = [prompts(prefix_tokens) for _ in range(rounds)]
    paired = [prompts(prefix_tokens) for _ in range(rounds)]  # the async rounds beside sync's
    warm = [prompts(prefix_tokens) for _ in WARM_MODES]  # every engine's unmeasured rounds
    decodes = [prompts(DECODE_PROMPT_TOKENS) for _ in range(NUM_DECODES)]
    kv_dir = engines.work / "slow-kv"
    results: dict[str, Any] = {
        "prefix_tokens": prefix_tokens,
        "rounds": rounds,
        "decodes": NUM_DECODES,
    }
    with _redis(engines.work) as redis_url:
        readers = f"&readers={file_readers}" if file_readers else ""
        tiers = {"file": f"file://{kv_dir}?size=40GiB{readers}", "redis": redis_url}
        _store(engines, prefixes + paired + warm, kv_dir, redis_url)
        resident = drop_page_cache(kv_dir)
        results["page_cache_after_drop_bytes"] = resident
        run = _Arm(prefixes, decodes, prompts, quiet_s, engines.max_model_len, warm, poll_s)
        extra: dict[str, Any] = {"load_finish_wait": finish_wait} if finish_wait else {}
        if load_fetch != "thread":
            extra["load_fetch"] = load_fetch
        with engines.engine("recompute", None, itl_engine_args()) as e:
            results["recompute"] = run(e, lambda: None)
        with engines.engine("vllm-hit", None, itl_engine_args()) as e:
            for prefix in [*warm, *prefixes]:  # into vLLM's own prefix cache
                completion(e, prefix, 1)
            results["vllm-hit"] = run(e, lambda: None)
        for tier, url in tiers.items():
            before: Callable[[], object] = (
                (lambda: drop_page_cache(kv_dir)) if tier == "file" else (lambda: None)
            )
            config = connector_config(
                [url], chunk_size=CHUNK_TOKENS, load_mode="async", request_load_mode=True,
                **extra,
            )  # fmt: skip
            with engines.engine(f"{tier}-paired", config, itl_engine_args()) as e:
                sync, asynchronous = run.paired(e, before, paired)
                breakdown = _load_breakdown(scrape(e))
            sync["load_breakdown"] = asynchronous["load_breakdown"] = breakdown
            asynchronous |= _paired_ratios(asynchronous["rounds"], sync["rounds"])
            results[f"{tier}/sync"], results[f"{tier}/async"] = sync, asynchronous
            config = connector_config([url], chunk_size=CHUNK_TOKENS, load_mode="auto", **extra)
            with engines.engine(f"{tier}-auto", config, itl_engine_args()) as e:
                results[f"{tier}/auto"] = run(e, before)
                results[f"{tier}/auto"]["cost_sync_loads"] = metric_value(
                    e, "kvstack_connector_cost_sync_loads_total"
                )
                results[f"{tier}/auto"]["load_breakdown"] = _load_breakdown(scrape(e))
    return results


def _paired_ratios(
    asynchronous: list[dict[str, Any]], sync: list[dict[str, Any]]
) -> dict[str, dict[str, float]]:
    """Each pair's async TTFT over its sync one, as the client saw it (``ttft_vs_sync``) and
    as the engine timed it (``engine_ttft_vs_sync``, the pairs where both rounds have it)."""
    pairs = list(zip(asynchronous, sync, strict=True))
    engine = [
        a["engine_ttft_s"] / b["engine_ttft_s"]
        for a, b in pairs
        if a.get("engine_ttft_s") and b.get("engine_ttft_s")
    ]
    out = {"ttft_vs_sync": spread([a["ttft_s"] / b["ttft_s"] for a, b in pairs]).as_dict()}
    if engine:
        out["engine_ttft_vs_sync"] = spread(engine).as_dict()
    return out


# Where a load's time goes, means over the engine's loads (seconds): ``step`` the engine step
# waiting for synchronous loads, ``fetch`` an asynchronous load's threads (the fetch, and the
# write unless the next step writes it), ``reported`` its start to the step that reports it to
# vLLM (fetch plus the wait for it), ``finish_wait`` a step's end waiting for a load about to
# end (load_finish_wait), with how many loads it waited for and how many of them it caught.
# The sync and async arms share an engine, and these.
BREAKDOWN = {
    "step": "kvstack_connector_load_seconds",
    "fetch": "kvstack_connector_async_fetch_seconds",
    "reported": "kvstack_connector_async_load_seconds",
    "finish_wait": "kvstack_connector_finish_wait_seconds",
}
BREAKDOWN_COUNTS = {
    "finish_waits": "kvstack_connector_finish_waits_total",
    "finish_wait_caught": "kvstack_connector_finish_wait_caught_total",
}


def _load_breakdown(text: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, metric in BREAKDOWN.items():
        count = metric_value(text, f"{metric}_count")
        out[f"{name}_s_mean"] = metric_value(text, f"{metric}_sum") / count if count else None
    for name, metric in BREAKDOWN_COUNTS.items():
        out[name] = metric_value(text, metric)
    return out


def _store(
    engines: Engines, prefixes: list[list[int]], kv_dir: Path, redis_url: str | None
) -> None:
    """One engine computes every prefix and writes its chunks to every slow tier, and stays up
    until they have all landed: vLLM's shutdown kills its worker at once, and tier writes
    still queued then are lost (a round would then load part of its prefix and recompute the
    rest)."""
    tiers = [f"file://{kv_dir}?size=40GiB", *([redis_url] if redis_url else [])]
    expected = sum(len(p) // CHUNK_TOKENS for p in prefixes)
    with engines.engine("writer", connector_config(tiers, chunk_size=CHUNK_TOKENS)) as writer:
        for prefix in prefixes:
            completion(writer, prefix, 1)
        deadline = time.monotonic() + STORE_TIMEOUT_S
        while (held := _stored(kv_dir, redis_url)) < expected:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the writer stored {held} of {expected} chunks in every slow tier "
                    f"within {STORE_TIMEOUT_S:g} s"
                )
            time.sleep(0.2)


def _stored(kv_dir: Path, redis_url: str | None) -> int:
    """Chunks held by the tier holding fewest: chunk files, and Redis keys under the prefix."""
    held = len(list(kv_dir.rglob(f"*{CHUNK_FILE_SUFFIX}")))
    if redis_url:
        import urllib.parse

        import redis

        url = urllib.parse.urlsplit(redis_url)  # the bench's own: redis://host:port/db?prefix=
        prefix = urllib.parse.parse_qs(url.query)["prefix"][0]
        host, port = url.hostname or "127.0.0.1", url.port or 6379
        client = redis.Redis(host=host, port=port, db=int(url.path.strip("/") or 0))
        try:
            held = min(held, sum(1 for _ in client.scan_iter(match=f"{prefix}*")))
        finally:
            client.close()
    return held


class _Arm:
    def __init__(
        self,
        prefixes: list[list[int]],
        decodes: list[list[int]],
        prompts: PromptFactory,
        quiet_s: float,
        max_model_len: int,
        warm: list[list[int]],
        poll_s: float = 0.0,
    ) -> None:
        self.prefixes, self.decodes = prefixes, decodes
        self.prompts, self.quiet_s = prompts, quiet_s
        self.max_model_len, self.warm = max_model_len, warm
        self.poll_s = poll_s

    def _warm_up(self, engine: VLLMServer, before_load: Callable[[], object], paired: bool) -> None:
        """The unmeasured rounds (:data:`WARM_MODES`), each its own stored prefix; an engine
        that serves one mode runs only its own."""
        stream_ttft(engine, self.prompts(64))
        modes = WARM_MODES if paired else WARM_MODES[-1:]
        for extra, prefix in zip(modes, self.warm[-len(modes) :], strict=True):
            self._round(engine, before_load, prefix, extra, [])

    def __call__(self, engine: VLLMServer, before_load: Callable[[], object]) -> dict[str, Any]:
        """Every prefix loaded in the engine's own load mode, one round each."""
        self._warm_up(engine, before_load, paired=False)
        rounds: list[dict[str, Any]] = []
        errors: list[str] = []
        for prefix in self.prefixes:
            rounds.append(self._round(engine, before_load, prefix, None, errors))
        return _summary(rounds, errors)

    def paired(
        self, engine: VLLMServer, before_load: Callable[[], object], second: list[list[int]]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(sync, async) on one engine that loads asynchronously and lets a request ask its
        own mode: pair i loads ``prefixes[i]`` within the step and ``second[i]`` off it, the
        order flipped every pair."""
        self._warm_up(engine, before_load, paired=True)
        arms: dict[str, tuple[list[dict[str, Any]], list[str]]] = {
            "sync": ([], []),
            "async": ([], []),
        }
        for i, (first, other) in enumerate(zip(self.prefixes, second, strict=True)):
            pair = [("sync", first, SYNC_MODE), ("async", other, None)]
            for mode, prefix, extra in pair if i % 2 == 0 else pair[::-1]:
                rounds, errors = arms[mode]
                rounds.append(self._round(engine, before_load, prefix, extra, errors))
        return _summary(*arms["sync"]), _summary(*arms["async"])

    def _round(
        self,
        engine: VLLMServer,
        before_load: Callable[[], object],
        prefix: list[int],
        extra: dict[str, Any] | None,
        errors: list[str],
    ) -> dict[str, Any]:
        # Fresh decodes every round, as long as the model length allows: a fast engine runs a
        # decode's whole budget within seconds, and a round must never find them finished.
        budget = self.max_model_len - DECODE_PROMPT_TOKENS - 64
        with DecodeStreams(engine, self.decodes, max_tokens=budget) as streams:
            streams.wait_running(8)
            before_load()
            quiet_text = scrape(engine)
            quiet_from = itl_counts(quiet_text)
            _poll(engine, lambda: time.sleep(self.quiet_s), None, self.poll_s)  # as the load
            start = time.perf_counter()
            text = scrape(engine)
            load_from = itl_counts(text)
            # One token: the loader adds no inter-token latency of its own to the window.
            loader = functools.partial(
                stream_ttft, engine, prefix + self.prompts(SUFFIX_TOKENS), max_tokens=1,
                **(extra or {}),
            )  # fmt: skip
            ttft, landed = _poll(engine, loader, _loads_done(text), self.poll_s)
            end = time.perf_counter()
            after, engine_ttft = _engine_ttft(engine, text)
            load_to = itl_counts(after)
            errors += streams.errors()
            return {
                "ttft_s": ttft,
                "engine_ttft_s": engine_ttft,
                "quiet": histogram_itl(quiet_from, load_from),
                "loading": histogram_itl(load_from, load_to),
                "in_flight": None if landed is None else histogram_itl(load_from, landed),
                "steps_quiet": _steps_timed(quiet_text, text, QUIET_STEPS),
                "steps_in_flight": _steps_timed(text, after, LOADING_STEPS),
                "client_quiet": itl(streams.gaps(start - self.quiet_s, start)),
                "client_loading": itl(streams.gaps(start, end)),
                # this round's own: the arms of a paired engine share its totals
                "async_loads": _loads_done(after) - _loads_done(text),
                "hit_tokens": metric_value(after, HIT_TOKENS) - metric_value(text, HIT_TOKENS),
            }


def _steps_timed(before: str, after: str, metric: str) -> dict[str, float] | None:
    """p50/p99 of the connector's step intervals (:data:`QUIET_STEPS`, :data:`LOADING_STEPS`)
    between two scrapes; None where there were none (plain vLLM, or no load in flight)."""
    timed = histogram_itl(itl_counts(before, metric), itl_counts(after, metric))
    return timed if timed["samples"] > 0 else None


def _engine_ttft(engine: VLLMServer, before: str) -> tuple[str, float | None]:
    """A scrape once the frontend has counted the loader finished, and the loader's TTFT as
    the engine timed it (:data:`ENGINE_TTFT`); None where not exactly one request finished
    since ``before`` (a decode ended too, or the count never came)."""
    count = f"{ENGINE_TTFT[0]}_count"
    counted = metric_value(before, count)
    deadline = time.monotonic() + FINISHED_WAIT_S
    while True:
        after = scrape(engine)
        finished = metric_value(after, count) - counted
        if finished >= 1 or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    if finished != 1:
        return after, None
    return after, sum(
        metric_value(after, f"{m}_sum") - metric_value(before, f"{m}_sum") for m in ENGINE_TTFT
    )


def _poll(
    engine: VLLMServer,
    work: Callable[[], T],
    loads_done: float | None = None,
    every_s: float = POLL_S,
) -> tuple[T, dict[float, float] | None]:
    """Run ``work`` while scraping ``/metrics`` every ``every_s``: what it returned, and the
    ITL histogram of the first scrape that counted more than ``loads_done`` asynchronous loads
    finished (None: none did, or not asked). Each scrape is read with one regular expression;
    only the one that ends the window is parsed whole (the engine's API server still renders
    every scrape whole). ``every_s`` 0: ``work`` alone, no scrape."""
    if every_s <= 0:
        return work(), None
    failed: list[BaseException] = []
    returned: list[T] = []

    def run() -> None:
        try:
            returned.append(work())
        except BaseException as exc:  # re-raised on the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=run, name="bench-loader", daemon=True)
    thread.start()
    landed = None
    while thread.is_alive():
        text = scrape(engine)
        if landed is None and loads_done is not None and _loads_done(text) > loads_done:
            landed = itl_counts(text)
        thread.join(every_s)
    if failed:
        raise failed[0]
    return returned[0], landed


_LOADS_DONE_LINE = re.compile(rf"^{LOADS_DONE}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)


def _loads_done(text: str) -> float:
    """:data:`LOADS_DONE` in a scrape's text (summed over label sets; 0 when absent)."""
    return sum(float(v) for v in _LOADS_DONE_LINE.findall(text))


def _summary(rounds: list[dict[str, Any]], errors: list[str]) -> dict[str, Any]:
    def of(path: Callable[[dict[str, Any]], float]) -> dict[str, float]:
        return spread([path(r) for r in rounds]).as_dict()

    engine_ttft = [r["engine_ttft_s"] for r in rounds if r.get("engine_ttft_s") is not None]
    optional: dict[str, Any] = {}
    if engine_ttft:
        optional["engine_ttft_s"] = spread(engine_ttft).as_dict()
    timed = [r for r in rounds if r.get("steps_in_flight") and r.get("steps_quiet")]
    if timed:  # the rounds whose load was in flight over a step (async, or auto's async ones)
        optional |= {
            "steps_in_flight_rounds": len(timed),
            "steps_quiet_p99_ms": spread([r["steps_quiet"]["p99_ms"] for r in timed]).as_dict(),
            "steps_in_flight_p99_ms": spread(
                [r["steps_in_flight"]["p99_ms"] for r in timed]
            ).as_dict(),
            "steps_in_flight_p99_ratio": spread(
                [r["steps_in_flight"]["p99_ms"] / r["steps_quiet"]["p99_ms"] for r in timed]
            ).as_dict(),
        }
    if rounds and all(r["in_flight"] for r in rounds):
        optional |= {
            "in_flight_p99_ms": of(lambda r: r["in_flight"]["p99_ms"]),
            "in_flight_p99_ratio": of(lambda r: r["in_flight"]["p99_ms"] / r["quiet"]["p99_ms"]),
        }
    return {
        "rounds": rounds,
        "errors": errors,
        "ttft_s": of(lambda r: r["ttft_s"]),
        "quiet_p50_ms": of(lambda r: r["quiet"]["p50_ms"]),
        "quiet_p99_ms": of(lambda r: r["quiet"]["p99_ms"]),
        "loading_p50_ms": of(lambda r: r["loading"]["p50_ms"]),
        "loading_p99_ms": of(lambda r: r["loading"]["p99_ms"]),
        "p99_ratio": of(lambda r: r["loading"]["p99_ms"] / r["quiet"]["p99_ms"]),
        **optional,
        "client_quiet_p99_ms": of(lambda r: r["client_quiet"]["p99_ms"]),
        "client_loading_p99_ms": of(lambda r: r["client_loading"]["p99_ms"]),
        "itl_source": "engine",
        "async_loads": sum(r.get("async_loads", 0) for r in rounds),
        "hit_tokens": sum(r.get("hit_tokens", 0) for r in rounds),
    }


@contextlib.contextmanager
def _redis(work: Path) -> Iterator[str]:
    from kvstack.kv.tiers.redis.redis_server import large_value_env

    with redis_server(work, large_value_env()) as port:
        yield f"redis://127.0.0.1:{port}/0?prefix=bench:&queue_bytes=2GiB&timeout_s=60"


def report_rows(results: dict[str, Any]) -> list[tuple[str, ...]]:
    """Table rows: arm, loader TTFT, ITL p50/p99 before and during loads, p99 ratio."""
    rows: list[tuple[str, ...]] = []
    for arm in ARMS:
        r = results.get(arm)
        if r is None:
            continue
        rows.append((
            arm,
            _fmt(r["ttft_s"], 1000, "ms"),
            f"{r['quiet_p50_ms']['median']:.0f} / {r['quiet_p99_ms']['median']:.0f}",
            f"{r['loading_p50_ms']['median']:.0f} / {r['loading_p99_ms']['median']:.0f}",
            _fmt(r["p99_ratio"], 1, "x"),
            _fmt(r[key], 1, "x") if (key := in_flight_key(r)) else "",
        ))  # fmt: skip
    return rows


def _fmt(s: dict[str, float], scale: float, unit: str) -> str:
    return (
        f"{s['median'] * scale:.2f}{unit} [{s['min'] * scale:.2f}-{s['max'] * scale:.2f}]"
        if unit == "x"
        else f"{s['median'] * scale:.0f} {unit} [{s['min'] * scale:.0f}-{s['max'] * scale:.0f}]"
    )
