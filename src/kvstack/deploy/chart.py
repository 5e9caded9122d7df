"""Render and lint the Helm chart offline, with Helm's own library (``helm-python-sdk``).

    manifests = render_chart(load_values(["values-gpu.yaml"], ["router.replicas=3"]))
    for m in manifests:
        print(m.kind, m.name)

No cluster and no ``helm`` binary are involved. Rendering validates the values against the
chart's ``values.schema.json`` and runs the templates' own checks (``fail``), which raise
:class:`ChartError` with Helm's message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kvstack.errors import ConfigError, KVStackError, require

__all__ = [
    "CHART_DIR",
    "ChartError",
    "ChartManifest",
    "LintReport",
    "lint_chart",
    "load_values",
    "render_chart",
]

# The chart in a source checkout: <repo>/deploy/helm/kvstack.
CHART_DIR = Path(__file__).resolve().parents[3] / "deploy" / "helm" / "kvstack"


class ChartError(KVStackError):
    """The chart failed to load, its values broke the schema, or a template failed."""


@dataclass(frozen=True)
class ChartManifest:
    """One rendered Kubernetes object and the template it came from."""

    template: str
    doc: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.doc.get("kind", ""))

    @property
    def name(self) -> str:
        return str(self.doc.get("metadata", {}).get("name", ""))

    def __str__(self) -> str:
        return f"{self.kind}/{self.name} ({self.template})"


@dataclass(frozen=True)
class LintReport:
    errors: list[str]
    warnings: list[str]

    @property
    def ok(self) -> bool:
        return not self.errors


def load_values(files: Iterable[str | Path] = (), sets: Sequence[str] = ()) -> dict[str, Any]:
    """Values as ``helm -f FILE... --set K=V...`` would merge them (later ones win)."""
    values: dict[str, Any] = {}
    for path in files:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read values file {str(path)!r}: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"values file {str(path)!r} must hold a mapping")
        values = merge_values(values, loaded)
    for expression in sets:
        values = merge_values(values, _helm().parse_set_string(expression))
    return values


def merge_values(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's merge of values files: maps merge key by key, anything else is replaced."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_values(out[key], value)
        else:
            out[key] = value
    return out


def render_chart(
    values: Mapping[str, Any] | None = None,
    *,
    chart_dir: Path = CHART_DIR,
    release: str = "kvstack",
    namespace: str = "default",
) -> list[ChartManifest]:
    """Every object the chart renders, in template order (NOTES.txt left out)."""
    helm = _helm()
    try:
        with helm.Chart.load(str(chart_dir)) as chart:
            rendered = chart.render(dict(values or {}), name=release, namespace=namespace)
    except helm.HelmError as exc:
        raise ChartError(str(exc)) from None
    manifests = []
    for template, text in sorted(rendered.items()):
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                manifests.append(ChartManifest(template, doc))
    return manifests


def lint_chart(
    values: Mapping[str, Any] | None = None,
    *,
    chart_dir: Path = CHART_DIR,
    namespace: str = "default",
    kube_version: str | None = None,
) -> LintReport:
    """``helm lint --strict``: errors and warnings (informational messages dropped)."""
    report = _helm().lint(
        str(chart_dir), dict(values or {}), strict=True, namespace=namespace,
        kube_version=kube_version,
    )  # fmt: skip
    messages = report.get("messages") or []
    errors = [f"{m['path']}: {m['error']}" for m in messages if m["severity"] >= 3]
    errors += list(report.get("errors") or [])
    warnings = [f"{m['path']}: {m['error']}" for m in messages if m["severity"] == 2]
    return LintReport(errors=errors, warnings=warnings)


def _helm() -> Any:
    return require("helm_python", "deploy")
