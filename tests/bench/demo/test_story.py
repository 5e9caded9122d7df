"""The story's verdicts without engines: what "identical" means, and that a mismatch fails."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest

from kvstack.bench.demo.ask import GreedyAnswer
from kvstack.bench.demo.report import DemoRow, verdicts
from kvstack.bench.demo.run import ALONE, _exit_code, stack_config
from kvstack.bench.demo.story import Story, make_prompts
from kvstack.bench.demo.ui import DemoConsole
from kvstack.bench.workloads.prompts import make_prompt_builder

REFERENCE = GreedyAnswer(0.2, (5, 6, 7), (-1.5, -0.25, -2.0), " a b c")


def story(**answers: GreedyAnswer | None) -> Story:
    parts: dict[str, GreedyAnswer | None] = {
        "cold": replace(REFERENCE, ttft_s=8.0),
        "other_instance": replace(REFERENCE, ttft_s=0.3),
        "without_kvstack": replace(REFERENCE, ttft_s=8.1),
        "reference": REFERENCE,
        "after_restart": replace(REFERENCE, ttft_s=0.4),
        "control": GreedyAnswer(0.5, (5, 9, 7), (-1.5, -0.5, -2.0), " a x c"),
    }
    parts.update(answers)
    return Story(**parts, loaded_tokens=(4096, 4096), document_tokens=4096, checks_tokens=True)  # type: ignore[arg-type]


def test_identical_means_tokens_logprobs_and_text_and_the_json_has_the_issues_keys() -> None:
    good = story()
    assert good.identical_tokens and good.control_differs and good.recomputed_tokens == 0
    assert good.to_json() == {
        "cold_ttft_s": 8.0,
        "other_instance_ttft_s": 0.3,
        "other_instance_without_kvstack_ttft_s": 8.1,
        "after_restart_ttft_s": 0.4,
        "identical_tokens": True,
    }
    last_bit = (-1.5, -0.25000001, -2.0)  # same tokens, a logprob off in the last bits
    assert not story(after_restart=replace(REFERENCE, logprobs=last_bit)).identical_tokens
    assert not story(other_instance=replace(REFERENCE, token_ids=(5, 6, 8))).identical_tokens


def test_a_mismatch_or_a_blind_control_fails_the_demo_loudly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ui = DemoConsole(live=False)
    assert _exit_code(story(), [], ui) == 0
    wrong = story(other_instance=replace(REFERENCE, token_ids=(5, 6, 8)))
    assert _exit_code(wrong, [], ui) == 1
    assert "FAILED: kvstack's answers differ from vLLM's own" in capsys.readouterr().out
    assert _exit_code(story(control=REFERENCE), [], ui) == 1
    assert "the identity check is blind" in capsys.readouterr().out


def test_the_document_is_whole_chunks_and_blocks_and_the_control_changes_only_its_last_chunk() -> (
    None
):
    prompts = make_prompts(make_prompt_builder("sim"), 4096, 24)
    assert len(prompts.document) == 4096 and len(prompts.question) == 24
    assert prompts.altered_document[:-256] == prompts.document[:-256]
    assert prompts.altered_document[-256:] != prompts.document[-256:]
    assert prompts.question != prompts.first_question


def row(workload: str, mode: str, p50: float, hits: float) -> DemoRow:
    return DemoRow(workload, mode, 32, 0, p50, p50 * 2, 10.0, hits)


def test_a_row_that_loses_is_printed_as_it_is_with_a_reason() -> None:
    rows = [
        row("multi-round-qa", "off", 1.2, 0.3),
        row("multi-round-qa", "on", 0.4, 0.8),
        row("long-doc-qa", "off", 1.0, 0.5),
        row("long-doc-qa", "on", 1.1, 0.52),
    ]
    (won, first), (lost, second) = verdicts(rows)
    assert won and "3.0x faster" in first
    assert not lost and "did NOT win" in second and "own caches already held" in second


def test_both_arms_run_the_same_engines_but_for_the_connector(tmp_path: Path) -> None:
    args = argparse.Namespace(engines="vllm", model_dir=str(tmp_path))
    on, off = stack_config(args, True, tmp_path / "on"), stack_config(args, False, tmp_path / "off")
    engine_on, alone = on.engines
    (engine_off,) = off.engines
    assert engine_on.connector is not None and engine_off.connector is None
    assert engine_on.model_copy(update={"connector": None}) == engine_off
    assert alone.name == ALONE and not alone.routed and alone.connector is None
    assert alone.args == engine_on.args
