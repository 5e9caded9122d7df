"""Generated docs stay in step with the code."""

from __future__ import annotations

from pathlib import Path

from kvstack.config_cli import reference_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_configuration_reference_is_generated_from_the_schema() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert reference_markdown() in doc, (
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
