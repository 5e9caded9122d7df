"""Generated docs stay in step with the code."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvstack.config_cli import reference_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_configuration_reference_is_generated_from_the_schema() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    for table in (reference_markdown(), reference_markdown(connector=True)):
        assert table in doc, (
            "docs/configuration.md is out of date: regenerate it with scripts/gen-config-docs.sh"
        )


def test_readme_quick_start_holds_exactly_the_two_commands_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("##", 1)[0]
    block = quick.split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["./scripts/demo.sh", "./scripts/test.sh"]
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_docs_the_readme_links_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    for target in ("docs/configuration.md", "docs/cluster-kv.md", "docs/deploy-kubernetes.md",
                   "docs/benchmarks.md", "docs/structure.md", "docs/migrating.md",
                   "examples/"):  # fmt: skip
        assert target in readme
        assert (ROOT / target).exists(), target


def test_the_readme_block_diagram_is_what_scripts_diagram_py_draws(tmp_path: Path) -> None:
    from matplotlib.testing.compare import compare_images

    committed = ROOT / "docs" / "img" / "kvstack-blocks.png"
    assert "](docs/img/kvstack-blocks.png)" in (ROOT / "README.md").read_text()
    assert committed.stat().st_size < 100_000
    spec = importlib.util.spec_from_file_location("diagram", ROOT / "scripts" / "diagram.py")
    assert spec is not None and spec.loader is not None
    diagram = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(diagram)
    fresh = diagram.draw(tmp_path / "blocks.png")
    # A changed word moves the RMS by ~2; font rasterisation across versions by far less.
    difference = compare_images(str(committed), str(fresh), tol=0.5)
    if difference is not None:
        pytest.fail(f"regenerate it: PYTHONPATH=src python scripts/diagram.py ({difference})")
