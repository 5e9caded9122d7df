"""Draw the README's block diagram (docs/img/kvstack-blocks.png) from the boxes below.

    PYTHONPATH=src python scripts/diagram.py [OUT.png]

The picture is docs/architecture.md's map: clients reach the router over the OpenAI API; the
router picks a vLLM engine from the KV each one holds (its radix tree, the engines' KV events,
the cluster index) and from load and adapter residency; each engine's KVStackConnector stores
and loads KV through KVCache, local tiers first, then tiers every engine shares; the LoRA
control plane verifies adapters and loads them into engines. Fixed sizes, fonts and no
timestamp in the file, so the same matplotlib draws the same bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from matplotlib.axes import Axes

OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "kvstack-blocks.png"
WIDTH, HEIGHT = 100.0, 58.0  # drawing units; the figure is 10 x 5.8 inches at 100 dpi

# colours by role: the request path, KV, the adapter control plane, outside kvstack
ROUTER, KV, LORA, OUTSIDE = "#d8eefe", "#d9f2e6", "#fde8cf", "#eeeeee"


class Block(NamedTuple):
    x: float
    y: float
    w: float
    h: float
    title: str
    detail: str
    colour: str


BLOCKS = {
    "clients": Block(34, 51, 32, 6, "clients", "openai SDK, curl, benchmarks", OUTSIDE),
    "router": Block(
        24, 37, 51, 9, "kvstack router",
        "admission → filters → scorers → picker\nprefix state · load · LoRA residency · TTFT model",
        ROUTER,
    ),
    "index": Block(
        1, 23, 19, 10, "cluster index",
        "kvstack index-server:\nwhich engine holds\nwhich chunk", KV,
    ),
    "engine_a": Block(24, 21, 24, 11, "vLLM engine", "KVStackConnector\n→ KVCache", OUTSIDE),
    "engine_b": Block(51, 21, 24, 11, "vLLM engine", "KVStackConnector\n→ KVCache", OUTSIDE),
    "local_a": Block(24, 12, 24, 5.5, "local tiers", "cpu:// → file://", KV),
    "local_b": Block(51, 12, 24, 5.5, "local tiers", "cpu:// → file://", KV),
    "shared": Block(
        24, 1, 51, 7, "shared tiers (every engine reads what any stored)",
        "redis:// (Redis/Valkey) · s3:// · peer:// (another host's local tiers)", KV,
    ),
    "lora": Block(
        81, 16, 18, 30, "LoRA control plane",
        "registry\n(SQLite | PostgreSQL)\n\nartifact store\n(dir | S3)\n\n"
        "verifier: sha256,\nEd25519 signatures\n\naudit log\n\n"
        "adapter cache manager:\nhot · warm · cold,\nbudgets, canaries",
        LORA,
    ),
}  # fmt: skip


class Arrow(NamedTuple):
    start: tuple[float, float]
    end: tuple[float, float]
    label: str
    dashed: bool = False
    label_at: tuple[float, float] | None = None  # centre of the label; None: right of the middle
    both_ways: bool = False


ARROWS = (
    Arrow((50, 51), (50, 46), "OpenAI HTTP"),
    Arrow((40, 37), (36, 32), "OpenAI HTTP"),
    Arrow((59, 37), (63, 32), ""),
    Arrow((24, 39), (15, 33), "lookups"),
    Arrow((24, 25), (20, 25), "announce", dashed=True, label_at=(22, 22.5)),
    Arrow((30, 32), (30, 37), "KV events", dashed=True),
    Arrow((36, 21), (36, 17.5), "", both_ways=True),  # KV stored and loaded
    Arrow((63, 21), (63, 17.5), "", both_ways=True),
    Arrow((36, 12), (36, 8), "", both_ways=True),
    Arrow((63, 12), (63, 8), "", both_ways=True),
    Arrow((81, 26), (75, 26), "load\nadapters", label_at=(78, 29)),
    Arrow((75, 42), (81, 42), "resolve", label_at=(78, 43.5)),
)


def draw(path: Path = OUT) -> Path:
    """Write the diagram to ``path`` (a PNG) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.family": "DejaVu Sans", "svg.hashsalt": "kvstack"})
    fig = plt.figure(figsize=(WIDTH / 10, HEIGHT / 10), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, WIDTH)
    ax.set_ylim(0, HEIGHT)
    ax.axis("off")
    for block in BLOCKS.values():
        _block(ax, block)
    for arrow in ARROWS:
        _arrow(ax, arrow)
    _legend(ax)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None}, pil_kwargs={"optimize": True})
    plt.close(fig)
    return path


def _block(ax: Axes, block: Block) -> None:
    from matplotlib.patches import FancyBboxPatch

    box = FancyBboxPatch(
        (block.x, block.y), block.w, block.h, boxstyle="round,pad=0,rounding_size=1",
        facecolor=block.colour, edgecolor="#555555", linewidth=1,
    )  # fmt: skip
    ax.add_patch(box)
    top = block.y + block.h - 1.2
    ax.text(block.x + block.w / 2, top, block.title, ha="center", va="top", fontsize=10,
            fontweight="bold")  # fmt: skip
    ax.text(block.x + block.w / 2, top - 2.4, block.detail, ha="center", va="top", fontsize=8,
            linespacing=1.3)  # fmt: skip


def _legend(ax: Axes) -> None:
    from matplotlib.patches import Rectangle

    entries = (
        (ROUTER, "kvstack: request path"),
        (KV, "kvstack: KV store and index"),
        (LORA, "kvstack: adapters"),
        (OUTSIDE, "vLLM (with kvstack's connector), clients"),
    )
    for i, (colour, text) in enumerate(entries):
        y = 8.5 - 2.4 * i
        ax.add_patch(Rectangle((1.5, y - 0.8), 1.6, 1.6, facecolor=colour, edgecolor="#555555"))
        ax.text(4, y, text, fontsize=7.5, va="center", color="#333333")


def _arrow(ax: Axes, arrow: Arrow) -> None:
    style = {"arrowstyle": "<->" if arrow.both_ways else "->", "color": "#333333", "lw": 1.1}
    if arrow.dashed:
        style["linestyle"] = "--"
    ax.annotate("", xy=arrow.end, xytext=arrow.start, arrowprops=style)
    if not arrow.label:
        return
    if arrow.label_at is None:
        x = (arrow.start[0] + arrow.end[0]) / 2 + 0.8
        y = (arrow.start[1] + arrow.end[1]) / 2
        ax.text(x, y, arrow.label, fontsize=7.5, va="center", color="#333333")
    else:
        x, y = arrow.label_at
        ax.text(x, y, arrow.label, fontsize=7.5, ha="center", va="center", color="#333333")


if __name__ == "__main__":
    print(draw(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
