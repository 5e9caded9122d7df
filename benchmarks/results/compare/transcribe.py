"""Keep the router tables that were not re-measured as result files, marked stale.

The router tables of ``docs/benchmarks.md`` were measured on 2026-11-29 at commit e7693eb
(published in 50b824e) and their raw runs were not kept. This reads the hot-prefix and unique
tables (and, when named, multi-round-qa's) from the doc as it stood before ``kvstack bench
report`` took it over and writes ``compare-router-<name>-2026-12-01.json`` beside this file with
``"provenance": "transcribed"`` and a ``"stale"`` note; the setup comes from the config (its
front ends without the ``kv_aware`` arm, which that run did not have)::

    git show 45c0223:docs/benchmarks.md > /tmp/benchmarks-old.md
    python benchmarks/results/compare/transcribe.py /tmp/benchmarks-old.md multi-round-qa
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
MEASURED_AT, PUBLISHED_IN, DAY = "e7693eb", "50b824e", "2026-11-29T00:00:00Z"
STALE = (
    f"measured on 2026-11-29 at commit {MEASURED_AT} (published in {PUBLISHED_IN}); the router "
    "and the simulator have changed since, and vllm-router's kv_aware arm, now in the config, "
    "was not run. Re-measure with the command above."
)
SECTIONS = {"hot-prefix": "### one hot prefix", "unique": "### unique prompts"}
# python transcribe.py OLD_DOC multi-round-qa: that table too, when it cannot be re-measured
MORE = {"multi-round-qa": "### multi-round-qa"}
FIELDS = (
    "goodput",
    "slo_attainment",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "prefix_hit_rate",
    "spread",
    "lag_share",
)


def _value(cell: str) -> float:
    cell = cell.strip().strip("*")
    return float(cell[:-1]) / 100 if cell.endswith("%") else float(cell)


def table_rows(doc: str, heading: str) -> list[dict[str, Any]]:
    """The rows of the first table after ``heading``."""
    lines = doc[doc.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| rate |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        row: dict[str, Any] = {"point": float(cells[0]), "frontend": cells[1]}
        row.update({k: _value(v) for k, v in zip(FIELDS, cells[2:], strict=True)})
        rows.append(row)
    return rows


def document(name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    config = Path("benchmarks/router") / f"{name}.yaml"
    exp = yaml.safe_load((ROOT / config).read_text())
    measured = list(dict.fromkeys(r["frontend"] for r in rows))
    fleet, sim = exp["fleet"], exp["fleet"]["sim"]
    return {
        "schema": 1,
        "bench": "compare",
        "command": f"kvstack bench compare --config {config.as_posix()} --duration 30",
        "commit": MEASURED_AT,
        "dirty": False,
        "measured": DAY,
        "seconds": None,
        "machine": {"cores": 2},
        "provenance": "transcribed",
        "stale": STALE,
        "result": {
            "variant": exp["name"],
            "config": config.as_posix(),
            "workload": exp["workload"],
            "working_set_tokens": None,
            "load": "rate",
            "points": [float(p) for p in exp["rates"]],
            "duration_s": 30.0,
            "seed": exp.get("seed", 0),
            "slo": exp["slo"],
            "fleet": {
                "kind": fleet["kind"],
                "engines": fleet["engines"],
                "kv_events": fleet["kv_events"],
                "sim": sim,
                "kv_capacity_tokens": fleet["engines"] * sim["num_blocks"] * sim["block_size"],
                "time_scale": sim["time_scale"],
            },
            "frontends": [f for f in exp["frontends"] if f["name"] in measured],
            "rows": rows,
        },
    }


def main(doc_path: str, *more: str) -> None:
    doc = Path(doc_path).read_text()
    for name, heading in (SECTIONS | {m: MORE[m] for m in more}).items():
        out = HERE / f"compare-router-{name}-2026-12-01.json"
        out.write_text(json.dumps(document(name, table_rows(doc, heading)), indent=1) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:])
