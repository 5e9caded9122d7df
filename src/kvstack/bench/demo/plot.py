"""The demo's picture: the story's four bars, then each workload's TTFT distributions."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvstack.bench.demo.report import DemoRow

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["STORY_BARS", "plot"]

# (label, story JSON key, kvstack served it)
STORY_BARS = (
    ("1. engine A\ncold", "cold_ttft_s", False),
    ("2. engine B\nkvstack", "other_instance_ttft_s", True),
    ("3. engine B's cores\nvLLM alone", "other_instance_without_kvstack_ttft_s", False),
    ("4. after restart\ndisk tier", "after_restart_ttft_s", True),
)
_KVSTACK, _PLAIN = "#2a9d8f", "#8d99ae"


def plot(
    story: dict[str, float | bool],
    rows: Sequence[DemoRow],
    path: Path,
    label: str,
    tokens_checked: bool = True,
) -> Path:
    """The PNG at ``path``; ``tokens_checked`` False (simulated engines): the story's title says
    that identity was not checked instead of claiming it."""
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font cache notice, once
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in rows))
    panels = 1 + len(workloads)
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.4), squeeze=False)
    _story_panel(axes[0][0], story, tokens_checked)
    for ax, workload in zip(axes[0][1:], workloads, strict=True):
        _load_panel(ax, workload, [r for r in rows if r.workload == workload])
    fig.suptitle(f"kvstack demo: prefill once ({label})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _story_panel(ax: Axes, story: dict[str, float | bool], tokens_checked: bool) -> None:
    values = [float(story[key]) for _, key, _ in STORY_BARS]
    colors = [_KVSTACK if kvstack else _PLAIN for _, _, kvstack in STORY_BARS]
    bars = ax.bar(range(4), values, color=colors)
    for bar, value in zip(bars, values, strict=True):
        ax.annotate(f"{value:.2f} s", (bar.get_x() + bar.get_width() / 2, value),
                    ha="center", va="bottom", fontsize=9)  # fmt: skip
    ax.set_xticks(range(4), [label for label, _, _ in STORY_BARS], fontsize=8)
    ax.set_ylabel("time to first token (s)")
    same = "identical tokens" if story.get("identical_tokens") else "TOKENS DIFFER"
    if not tokens_checked:
        same = "simulated: tokens not checked"
    ax.set_title(f"one document, prefilled once ({same})")


def _load_panel(ax: Axes, workload: str, rows: Sequence[DemoRow]) -> None:
    rows = sorted(rows, key=lambda r: r.mode)  # off, on
    data = [r.ttft_s or [0.0] for r in rows]
    ax.boxplot(data, showfliers=False, widths=0.5)
    jitter = random.Random(0)
    for i, (row, values) in enumerate(zip(rows, data, strict=True), start=1):
        color = _KVSTACK if row.mode == "on" else _PLAIN
        xs = [i + jitter.uniform(-0.15, 0.15) for _ in values]
        ax.scatter(xs, values, s=12, color=color, alpha=0.8, zorder=3)
    labels = [f"kvstack {r.mode}\n{r.requests} requests" for r in rows]
    ax.set_xticks(range(1, len(rows) + 1), labels, fontsize=8)
    ax.set_ylabel("time to first token (s)")
    ax.set_title(f"{workload}: two engines behind the router")
