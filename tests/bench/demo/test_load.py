"""A load cell: exactly N requests of a workload, timed, with the engines' cache counters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvstack.bench.demo.load import LoadCell, measure_cell
from kvstack.bench.workloads.prompts import make_prompt_builder
from kvstack.stack.config import StackConfig, StackEngineSpec
from kvstack.stack.supervisor import Stack


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    spec = StackEngineSpec(name="sim", kind="sim", served_model_name="demo", max_model_len=4096)
    run_dir = tmp_path_factory.mktemp("stack")
    stack = Stack(StackConfig(run_dir=str(run_dir), engines=[spec], router=None))
    stack.start(show_progress=False)
    yield stack.url("engine")
    stack.stop()


@pytest.mark.slow
def test_a_cell_sends_exactly_its_requests_and_counts_cache_hits(engine: str) -> None:
    params = {"num_documents": 2, "document_tokens": 512, "question_tokens": 8, "output_tokens": 4}
    cell = LoadCell("long-doc-qa", params, "off", num_requests=7, concurrency=3, seed=0)
    row = measure_cell(engine, [engine], cell, make_prompt_builder("sim"), show_progress=False)
    assert (row.workload, row.mode, row.requests, row.errors) == ("long-doc-qa", "off", 7, 0)
    assert len(row.ttft_s) == 7 and row.ttft_s == sorted(row.ttft_s)
    assert 0 < row.ttft_p50_s <= row.ttft_p90_s
    assert row.cache_hit_rate > 0.5  # two documents, seven requests: most prompts were cached
