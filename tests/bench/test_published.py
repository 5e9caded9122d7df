"""Every published benchmark figure comes from a committed result file.

- each generated region of docs/benchmarks.md and README.md equals what ``kvstack bench
  report`` renders from ``benchmarks/results/`` (so a figure typed by hand, or a result changed
  without regenerating the docs, fails here);
- no Markdown table with a figure sits outside a region in docs/benchmarks.md or the README's
  Benchmarks section;
- every committed result loads, names a known benchmark, and carries its command and commit;
- and the check can fail: a changed figure in a copy of the results changes the rendering.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kvstack.bench import cli, report
from kvstack.bench.results import load

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
BENCHES = set(cli.BENCHMARKS) | {"demo"}


def _committed_results() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "benchmarks/results"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    own = tuple(f"benchmarks/results/{d}/" for d in report.OWN_FORMAT)
    return [ROOT / p for p in listed if p.endswith(".json") and not p.startswith(own)]


@pytest.mark.parametrize("target", report.TARGETS, ids=str)
def test_each_region_is_what_its_results_render(target: Path) -> None:
    text = (ROOT / target).read_text()
    assert report.regions_in(text), f"{target} has no generated region"
    _, changed = report.render_all(text, RESULTS)
    assert not changed, f"{target}: regions {changed} differ from `kvstack bench report`"


def _tables_outside_regions(text: str) -> list[str]:
    outside = re.sub(r"<!-- bench-report:([\w.-]+) -->.*?<!-- /bench-report:\1 -->", "", text,
                     flags=re.S)  # fmt: skip
    rows = [line for line in outside.splitlines() if line.startswith("|")]
    return [r for r in rows if re.search(r"\d", r) and not re.fullmatch(r"[|\-: ]+", r)]


def test_no_figure_table_is_typed_by_hand() -> None:
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    assert _tables_outside_regions(docs) == []
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    assert _tables_outside_regions(section) == []


def test_every_committed_result_is_a_result_of_a_known_benchmark() -> None:
    files = _committed_results()
    assert files, "no committed results under benchmarks/results"
    for path in files:
        r = load(path)
        assert r.bench in BENCHES, f"{path}: unknown benchmark {r.bench!r}"
        assert r.command.startswith("kvstack "), path
        assert re.fullmatch(r"[0-9a-f]{7,40}", r.commit), f"{path}: commit {r.commit!r}"
        assert path.parent.name == r.bench and path.name.startswith(f"{r.bench}-"), path
        if r.provenance == "transcribed":
            assert r.stale, f"{path}: a transcribed result must say why it is stale"


def test_a_changed_figure_changes_the_published_table(tmp_path: Path) -> None:
    copy = tmp_path / "results"
    shutil.copytree(RESULTS, copy)
    path = copy / "index" / "index-2026-12-01.json"
    text = path.read_text()
    changed = re.sub(r'("p99_ms": )(\d+\.\d+)', r"\g<1>123.456", text, count=1)
    assert changed != text
    path.write_text(changed)
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    _, regions = report.render_all(docs, copy)
    assert "index" in regions


def test_report_check_exits_1_and_names_the_region(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    (root / "docs").mkdir(parents=True)
    shutil.copytree(RESULTS, root / "benchmarks" / "results")
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    doctored = re.sub(r"(<!-- bench-report:index -->\n)", r"\1| typed | 1.0 |\n", docs)
    (root / "docs" / "benchmarks.md").write_text(doctored)
    assert report.run(["--check", "--root", str(root)]) == 1
    assert (root / "docs" / "benchmarks.md").read_text() == doctored  # --check changes nothing
    assert report.run(["--root", str(root)]) == 0
    assert report.run(["--check", "--root", str(root)]) == 0
