"""``kvstack demo`` as a user runs it: on simulated engines (what CI checks on every change), and
the story on real vLLM engines, each on its own core."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.stack.test_up import kvstack

STORY_KEYS = {
    "cold_ttft_s",
    "other_instance_ttft_s",
    "other_instance_without_kvstack_ttft_s",
    "after_restart_ttft_s",
    "identical_tokens",
}


@pytest.mark.slow
def test_the_story_on_simulated_engines(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    demo = kvstack("demo", "--engines", "sim", "--quick", "--out", str(out), "--no-progress",
                   timeout=300)  # fmt: skip
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    for step in ("1. engine A reads", "2. engine B", "3. the same question", "4. both engines"):
        assert step in demo.stdout
    assert re.search(r"engine B answered in [\d.]+ s instead of [\d.]+ s: \d+x faster", demo.stdout)
    assert (out / "demo.png").stat().st_size > 10_000
    document = json.loads((out / "demo.json").read_text())
    story = document["story"]
    assert set(story) == STORY_KEYS and document["load"] == []
    # the simulator models a tier hit as a transfer, not a prefill
    assert story["other_instance_ttft_s"] < story["other_instance_without_kvstack_ttft_s"] / 3
    assert story["after_restart_ttft_s"] < story["cold_ttft_s"] / 3
    assert document["story_details"]["loaded_tokens"] == [4096, 4096]


@pytest.mark.vllm
@pytest.mark.slow
def test_the_story_on_vllm_engines_each_on_its_own_core(tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores: one per engine")
    out = tmp_path / "demo"
    env_quick = {"KVSTACK_DEMO_QUICK": "1"}  # the story only, as a user asks for it
    demo = kvstack(
        "demo", "--engines", "vllm", "--model", "toy", "--out", str(out), "--no-progress",
        timeout=900, env=env_quick,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    document = json.loads((out / "demo.json").read_text())
    assert document["story"]["identical_tokens"] is True and document["load"] == []
    details = document["story_details"]
    assert details["control_differs"] is True  # a changed chunk of KV changes the answer
    assert details["loaded_tokens"] == [4096, 4096] and details["recomputed_tokens"] == 0
    logs = out / "run" / "on" / "logs"
    bound = {name: _bound_cores(logs / f"{name}.log") for name in ("engine-0", "engine-1")}
    assert bound == {"engine-0": "[0]", "engine-1": "[1]"}
    assert _bound_cores(logs / "vllm-alone.log") == "[1]"  # the reference shares B's core


def _bound_cores(log: Path) -> str:
    """The cores vLLM's worker bound its OpenMP threads to, from its start-up log."""
    found = re.findall(r"local_rank=0, core ids=(\[[\d, ]*\])", log.read_text())
    assert found, f"no thread binding line in {log}"
    return str(found[0])
