"""Every experiment shipped under benchmarks/compare loads and names known front ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstack.bench.compare.experiment import load_experiment
from kvstack.bench.compare.frontends import preset_command
from kvstack.bench.workloads import make_workload
from kvstack.bench.workloads.prompts import SimPromptBuilder

FILES = sorted((Path(__file__).parents[3] / "benchmarks" / "compare").glob("*.yaml"))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_experiment_is_valid(path: Path) -> None:
    exp = load_experiment(path)
    for frontend in exp.frontends:
        if frontend.preset:
            assert preset_command(frontend.preset)
    workload = make_workload(exp.workload.name, exp.workload.params, SimPromptBuilder(), 0)
    if path.stem in ("shared-prefix", "multi-round-qa"):  # sized against the fleet KV
        sim = exp.fleet.sim_config()
        capacity = exp.fleet.engines * sim.num_blocks * sim.block_size
        share = (workload.working_set_tokens() or 0) / capacity
        assert 0.7 <= share <= 1.1, f"working set is {share:.0%} of the fleet's KV"


def test_there_are_experiments() -> None:
    assert {p.stem for p in FILES} >= {"shared-prefix", "multi-round-qa", "unique", "lora-zipf"}
