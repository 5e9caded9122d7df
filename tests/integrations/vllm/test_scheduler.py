"""The scheduler side's decisions, over a real lookup server and vLLM-shaped requests."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm")

from kvstack.integrations.settings import ConnectorSettings
from kvstack.integrations.vllm.load_cost import LoadSample
from kvstack.integrations.vllm.lookup import LookupServer, PrefixAnswer, lookup_endpoint
from kvstack.integrations.vllm.scheduler import KVStackWorkerMeta, SchedulerSide
from kvstack.kv.config import KVConfig

CHUNK, BLOCK = 8, 4


class Store:
    """What the worker would answer: how many leading chunks are stored, how many in memory."""

    def __init__(self) -> None:
        self.stored, self.in_memory = 0, 0
        self.release = threading.Event()  # cleared: answers wait (a slow remote tier)
        self.release.set()

    def __call__(self, keys: Sequence[bytes]) -> PrefixAnswer:
        self.release.wait()
        found = min(self.stored, len(keys))
        return PrefixAnswer(found, min(self.in_memory, found))


@pytest.fixture
def store() -> Iterator[tuple[Store, str]]:
    engine = uuid.uuid4().hex
    answers = Store()
    server = LookupServer(lookup_endpoint(engine, 0), answers)
    yield answers, engine
    answers.release.set()
    server.close()


def side(engine: str, background: bool = False, **settings: Any) -> SchedulerSide:
    kv = KVConfig(model="m", chunk_size=CHUNK)
    return SchedulerSide(kv, BLOCK, engine, ConnectorSettings(**settings), (True, True), background)


def request(req_id: str, tokens: list[int], preemptions: int = 0) -> Any:
    return SimpleNamespace(
        request_id=req_id, prompt_token_ids=list(tokens), all_token_ids=tokens,
        num_prompt_tokens=len(tokens), lora_request=None, cache_salt=None,
        num_preemptions=preemptions,
    )  # fmt: skip


Cached = tuple[str, int, "list[int] | None"]  # request id, computed tokens, new block ids


def output(new: Sequence[Any] = (), cached: Sequence[Cached] = (), **kw: Any) -> Any:
    """A SchedulerOutput as the connector reads it."""
    ids = [c[0] for c in cached]
    return SimpleNamespace(
        scheduled_new_reqs=list(new),
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=ids, resumed_req_ids=set(kw.get("resumed", ())),
            new_block_ids=[None if c[2] is None else (c[2],) for c in cached],
            num_computed_tokens=[c[1] for c in cached],
        ),
        num_scheduled_tokens=kw.get("scheduled", {}),
        scheduled_spec_decode_tokens={},
        preempted_req_ids=set(kw.get("preempted", ())),
    )  # fmt: skip


def matched(s: SchedulerSide, r: Any, computed: int = 0) -> tuple[int, bool]:
    """``get_num_new_matched_tokens`` as vLLM's scheduler calls it: again each step while the
    answer is not known (None); here each 'step' is a retry."""
    deadline = time.monotonic() + 10
    while (answer := s.num_new_matched_tokens(r, computed))[0] is None:
        assert time.monotonic() < deadline, "the lookup never answered"
    return answer[0], answer[1]


def new_req(req_id: str, blocks: list[int], computed: int) -> Any:
    return SimpleNamespace(req_id=req_id, block_ids=(blocks,), num_computed_tokens=computed)


def plan_async_load(s: SchedulerSide, req_id: str) -> Any:
    """A 20-token request whose 2 stored chunks (16 tokens) ``s`` loads asynchronously, its
    blocks allocated: what vLLM's scheduler does before the step's metadata."""
    r = request(req_id, list(range(20)))
    s.on_new_request(r)
    assert matched(s, r) == (16, True)
    s.after_alloc(r, [1, 2, 3, 4, 5], 16)
    return r


def test_a_load_from_a_slow_tier_is_asynchronous_and_starts_next_step(
    store: tuple[Store, str],
) -> None:
    answers, engine = store
    answers.stored, answers.in_memory = 3, 1  # chunks 1 and 2 are only on disk
    s = side(engine, load_mode="async")  # auto would measure this small load within the step
    r = request("a", list(range(30)))
    s.on_new_request(r)
    assert matched(s, r) == (24, True)
    s.after_alloc(r, list(range(100, 108)), 24)
    meta = s.build_meta(output())  # the request is not scheduled while it loads
    assert [io.req_id for io in meta.async_loads] == ["a"] and not meta.loads
    assert [c.block_ids for c in meta.async_loads[0].chunks] == [[100, 101], [102, 103], [104, 105]]
    assert s.build_meta(output()).async_loads == []  # started once
    s.close()


def test_a_load_served_from_memory_stays_in_the_step(store: tuple[Store, str]) -> None:
    answers, engine = store
    answers.stored = answers.in_memory = 2
    s = side(engine)
    r = request("b", list(range(20)))
    s.on_new_request(r)
    assert matched(s, r) == (16, False)
    s.after_alloc(r, [1, 2, 3, 4, 5], 16)
    meta = s.build_meta(output([new_req("b", [1, 2, 3, 4, 5], 16)], scheduled={"b": 4}))
    assert [io.req_id for io in meta.loads] == ["b"] and not meta.async_loads
    assert matched(side(engine, load_mode="async"), r) == (0, False)  # untracked
    s.close()


def test_an_abort_before_the_load_starts_sends_an_empty_load(store: tuple[Store, str]) -> None:
    answers, engine = store
    answers.stored = 2
    s = side(engine, load_mode="async")
    r = plan_async_load(s, "c")
    assert s.loading == {"c"}
    assert s.request_finished(r) is False
    assert s.loading == set()  # no longer counted as in flight
    meta = s.build_meta(output())
    assert [(io.req_id, io.chunks) for io in meta.async_loads] == [("c", [])]  # vLLM waits for it
    s.close()


def test_generated_chunks_are_saved_and_a_background_copy_holds_the_blocks(
    store: tuple[Store, str],
) -> None:
    _, engine = store
    s = side(engine, background=True)
    tokens = list(range(10))
    r = request("d", tokens)
    s.on_new_request(r)
    assert matched(s, r) == (0, False)
    s.after_alloc(r, [1, 2, 3], 0)
    meta = s.build_meta(output([new_req("d", [1, 2, 3], 0)], scheduled={"d": 10}))
    assert [c.chunk for io in meta.saves for c in io.chunks] == [0]
    tokens += [50, 51, 52, 53, 54, 55, 56]  # decode: 16 tokens known, 16 computed after step 3
    s.build_meta(output(cached=[("d", 10, [4])], scheduled={"d": 1}))
    meta = s.build_meta(output(cached=[("d", 15, None)], scheduled={"d": 1}))
    assert [(c.chunk, c.generated) for io in meta.saves for c in io.chunks] == [(1, True)]
    assert s.request_finished(r) is True  # step 3's copy-out is not known to be over
    assert s.build_meta(output()).held == ["d"]
    s.on_worker_output(SimpleNamespace(
        kv_connector_worker_meta=KVStackWorkerMeta(4), finished_recving=None,
        finished_sending={"d"}, invalid_block_ids=set(),
    ))  # fmt: skip
    assert len(s.take_stats().data["hold_seconds"]) == 1  # type: ignore[union-attr]
    r2 = request("e", list(range(10)))
    s.on_new_request(r2)
    s.after_alloc(r2, [7, 8, 9], 0)
    s.build_meta(output([new_req("e", [7, 8, 9], 0)], scheduled={"e": 9}))  # step 5 saves
    s.on_worker_output(SimpleNamespace(
        kv_connector_worker_meta=KVStackWorkerMeta(5), finished_recving=None,
        finished_sending=None, invalid_block_ids=set(),
    ))  # fmt: skip
    assert s.request_finished(r2) is False  # its copy-out is over: blocks free at once
    s.close()


def test_a_preempted_request_resumes_from_its_saved_chunks(store: tuple[Store, str]) -> None:
    answers, engine = store
    s = side(engine)
    tokens = list(range(12))
    r = request("p", tokens)
    s.on_new_request(r)
    s.after_alloc(r, [1, 2, 3], 0)
    s.build_meta(output([new_req("p", [1, 2, 3], 0)], scheduled={"p": 12}))
    tokens += list(range(100, 110))  # 10 tokens generated (KV of 21 computed); preempted
    s.build_meta(output(cached=[("p", 12, [4, 5])], scheduled={"p": 9}))
    answers.stored = answers.in_memory = 2  # chunks 0 and 1 were saved
    r.num_preemptions = 1
    assert matched(s, r) == (16, False)
    s.after_alloc(r, [5, 6, 7, 8, 9, 10], 16)
    meta = s.build_meta(output(cached=[("p", 16, [5, 6, 7, 8, 9, 10])], resumed={"p"},
                               scheduled={"p": 5}))  # fmt: skip
    assert [c.chunk for io in meta.loads for c in io.chunks] == [0, 1]
    stats = s.take_stats()
    assert stats is not None
    assert stats.data["preemption_recoveries"] == 1
    assert stats.data["preemption_recovered_tokens"] == 16
    assert stats.data["recomputed_tokens"] == 5  # positions 16..20 are computed again
    s.close()


def _report_step(s: SchedulerSide, samples: Sequence[LoadSample] = ()) -> None:
    """The worker's report of the scheduler's latest step, with these load timings."""
    s.on_worker_output(SimpleNamespace(
        kv_connector_worker_meta=KVStackWorkerMeta(s.step, s.step, list(samples)),
        finished_recving=None, finished_sending=None, invalid_block_ids=set(),
    ))  # fmt: skip


def _timed_steps(s: SchedulerSide, seconds: float, count: int = 4) -> None:
    """``count`` steps of one running request, each reported ``seconds`` after scheduled."""
    for _ in range(count):
        s.build_meta(output(scheduled={"running": 1}))
        s.cost._started[s.step] -= seconds  # as if scheduled that long ago
        _report_step(s)


def _measured_load(
    s: SchedulerSide, answers: Store, req_id: str, seconds: float, within: bool
) -> None:
    """A slow-tier load of 2 chunks that the worker reports having taken ``seconds``."""
    answers.stored, answers.in_memory = 2, 0
    r = request(req_id, list(range(20)))
    s.on_new_request(r)
    matched(s, r)
    _report_step(s, [LoadSample(req_id, 2, seconds, within)])
    s.request_finished(r)


def _decide_after(
    engine: str, answers: Store, step_s: float, within_s: float, off_s: float, **settings: Any
) -> tuple[SchedulerSide, tuple[int, bool]]:
    """A side that measured steps of ``step_s`` and 2-chunk loads of ``within_s`` in the step
    and ``off_s`` off it, and its answer for the next slow-tier load of 2 chunks."""
    s = side(engine, **settings)
    _timed_steps(s, step_s)
    _measured_load(s, answers, "first", within_s, within=True)
    _measured_load(s, answers, "second", off_s, within=False)
    r = request("next", list(range(20)))
    s.on_new_request(r)
    return s, matched(s, r)


def test_auto_loads_a_slow_tier_within_the_step_once_measured_cheaper_there(
    store: tuple[Store, str],
) -> None:
    answers, engine = store
    # 15 ms steps; 3 ms a chunk in the step, 1 s a chunk off it
    s, answer = _decide_after(engine, answers, 0.015, 0.006, 2.0)
    assert answer == (16, False)
    assert s.take_stats().data["cost_sync_loads"] >= 1  # type: ignore[union-attr]
    forced, answer = _decide_after(engine, answers, 0.015, 0.006, 2.0, load_mode="async")
    assert answer == (16, True)  # async: always
    s.close()
    forced.close()


def test_auto_keeps_a_load_off_the_step_when_it_would_stall_the_batch(
    store: tuple[Store, str],
) -> None:
    answers, engine = store
    # 20 ms steps; 100 ms a chunk in the step, 10 ms off it
    s, answer = _decide_after(engine, answers, 0.020, 0.200, 0.020)
    assert answer == (16, True)
    s.close()


def test_worker_reports_of_every_rank_keep_the_slowest_load() -> None:
    a = KVStackWorkerMeta(5, 7, [LoadSample("r", 2, 0.010, True), LoadSample("q", 1, 0.002, True)])
    b = KVStackWorkerMeta(4, 7, [LoadSample("r", 2, 0.030, True)])
    merged = a.aggregate(b)
    assert merged.copied_through_step == 4 and merged.step == 7
    assert sorted(merged.load_samples) == [("q", 1, 0.002, True), ("r", 2, 0.030, True)]


def test_a_slow_lookup_defers_its_request_instead_of_stalling_the_scheduler(
    store: tuple[Store, str],
) -> None:
    answers, engine = store
    answers.stored, answers.in_memory = 3, 3
    s = side(engine)
    r = request("slow", list(range(30)))
    s.on_new_request(r)
    answers.release.clear()  # the worker's answer waits on a remote tier
    started = time.perf_counter()
    assert s.num_new_matched_tokens(r, 0) == (None, False)  # vLLM: ask again next step
    assert s.num_new_matched_tokens(r, 0) == (None, False)
    assert time.perf_counter() - started < 1.0  # a few ms each, not the 2 s lookup timeout
    answers.release.set()
    assert matched(s, r) == (24, False)
    stats = s.take_stats()
    assert stats is not None and stats.data["lookup_deferrals"] >= 2
    s.close()


def test_an_unanswered_lookup_is_a_miss_after_its_timeout(store: tuple[Store, str]) -> None:
    answers, engine = store
    answers.stored = 3
    s = side(engine, lookup_timeout_s=0.2)
    r = request("lost", list(range(30)))
    s.on_new_request(r)
    answers.release.clear()
    assert s.num_new_matched_tokens(r, 0) == (None, False)
    time.sleep(0.3)
    assert s.num_new_matched_tokens(r, 0) == (0, False)  # computed normally
    answers.release.set()
    s.close()


def test_a_request_that_goes_away_cancels_its_lookup(store: tuple[Store, str]) -> None:
    answers, engine = store
    answers.stored = 3
    s = side(engine)
    r = request("gone", list(range(30)))
    s.on_new_request(r)
    answers.release.clear()
    assert s.num_new_matched_tokens(r, 0) == (None, False)
    assert s.client.outstanding == 1
    s.request_finished(r)
    assert s.client.outstanding == 0
    answers.release.set()  # its late answer is dropped; the next lookup gets its own
    r2 = request("next", list(range(30)))
    s.on_new_request(r2)
    assert matched(s, r2) == (24, False)
    s.close()


def test_an_oversized_lookup_is_dropped_before_it_is_read(store: tuple[Store, str]) -> None:
    """libzmq refuses a question over MAX_QUESTION_BYTES; it times out as a miss, and the
    server keeps answering."""
    from kvstack.integrations.vllm.lookup import MAX_QUESTION_BYTES, LookupClient

    answers, engine = store
    answers.stored = 2
    client = LookupClient([lookup_endpoint(engine, 0)], timeout_s=0.3)
    huge = client.start([[b"k" * 32] * (MAX_QUESTION_BYTES // 32 + 1)])
    assert client.poll(huge, wait_s=1.0) == PrefixAnswer(0, 0)
    client.close()
    client = LookupClient([lookup_endpoint(engine, 0)], timeout_s=5.0)
    assert client.poll(client.start([[b"a", b"b", b"c"]]), wait_s=5.0) == PrefixAnswer(2, 0)
    client.close()


def _asking(req_id: str, params: Any) -> Any:
    r = request(req_id, list(range(30)))
    r.kv_transfer_params = params
    return r


def test_a_request_sets_its_own_load_mode_where_the_engine_allows_it(
    store: tuple[Store, str], caplog: pytest.LogCaptureFixture
) -> None:
    answers, engine = store
    answers.stored, answers.in_memory = 3, 0  # on disk only: async by the engine's mode
    s = side(engine, load_mode="async", request_load_mode=True)
    asks = {
        "sync": {"kvstack": {"load_mode": "sync"}},
        "async": {"kvstack": {"load_mode": "async"}},
        "none": None,
        "other": {"do_remote_prefill": True},
        "bad": {"kvstack": {"load_mode": "fast"}},
    }
    got = {}
    for name, params in asks.items():
        r = _asking(name, params)
        s.on_new_request(r)
        got[name] = matched(s, r)[1]
    assert got == {"sync": False, "async": True, "none": True, "other": True, "bad": True}
    assert "load_mode='fast' is not one of auto, async, sync" in caplog.text
    s.request_finished(_asking("sync", None))
    assert "sync" not in s.load_modes
    s.close()
    closed = side(engine, load_mode="async")  # the default: a request's own mode is ignored
    r = _asking("sync", asks["sync"])
    closed.on_new_request(r)
    assert matched(closed, r) == (24, True)
    closed.close()


def test_step_intervals_of_continuing_requests_are_split_by_loads_in_flight(
    store: tuple[Store, str],
) -> None:
    answers, engine = store
    answers.stored = 2
    s = side(engine, load_mode="async")
    decoding = {"d": 1}

    def step(scheduled: dict[str, int] = decoding) -> None:
        s.build_meta(output(scheduled=scheduled))
        time.sleep(0.002)

    step()
    step()  # d ran in both: a quiet interval
    plan_async_load(s, "a")
    step()  # quiet: no load was in flight at the last step's start; a's load starts now
    step()  # in flight
    s.on_worker_output(SimpleNamespace(
        kv_connector_worker_meta=None, finished_recving={"a"}, finished_sending=None,
        invalid_block_ids=None,
    ))  # fmt: skip
    step()  # the step that began with a's load in flight, which it reported done
    step()  # quiet again
    step({"e": 16})  # no request ran in both: not an inter-token gap
    step({"e": 1})
    stats = s.take_stats()
    assert stats is not None
    quiet, loading = (
        stats.data["step_interval_seconds"],
        stats.data["loading_step_interval_seconds"],
    )
    assert (len(quiet), len(loading)) == (4, 2)
    assert min(quiet + loading) >= 0.002
    s.close()
