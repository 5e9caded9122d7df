"""The metric names a dashboard or an autoscaling query may use: what kvstack and vLLM export.

Three sources, each found without a running process:

- kvstack's own metrics: every module under ``src/kvstack`` that declares metrics through
  :mod:`kvstack.metrics` is imported (found by reading the sources, so new components are
  picked up without a list to maintain) and the default Prometheus registry is read.
- the connector's ``kvstack_connector_*`` metrics, which live in vLLM's registry: read from
  ``integrations/vllm/stats.py`` by evaluating the ``name=`` arguments of its metric
  constructors (importing it would import vLLM).
- vLLM's ``vllm:*`` metrics: extracted from vLLM's ``v1/metrics/loggers.py`` (see
  :func:`vllm_metrics_from_source`) into a checked-in list.

Names are expanded to the sample names Prometheus stores (``_total``, ``_bucket``, ``_sum``...).
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry

__all__ = [
    "METRIC_TYPES",
    "connector_metrics",
    "exported_names",
    "kvstack_metric_modules",
    "kvstack_metrics",
    "parse_metric_list",
    "vllm_metrics_from_source",
]

METRIC_TYPES = ("counter", "gauge", "histogram", "summary", "info")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": (),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "info": ("_info",),
}
PACKAGE_DIR = Path(__file__).resolve().parents[1]
_DECLARES = re.compile(r"^from kvstack\.metrics import|^import kvstack\.metrics", re.M)
_SKIP = ("kvstack.integrations.vllm",)  # imports vLLM; read statically instead


def exported_names(name: str, kind: str) -> set[str]:
    """The sample names of one metric; counters are declared with or without ``_total``."""
    base = name.removesuffix("_total") if kind == "counter" else name
    return {base, *(base + suffix for suffix in SUFFIXES[kind])}


def kvstack_metric_modules(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Modules that declare metrics through :mod:`kvstack.metrics` (vLLM-side ones excluded)."""
    modules = []
    for path in sorted(package_dir.rglob("*.py")):
        module = ".".join(("kvstack", *path.relative_to(package_dir).with_suffix("").parts))
        if module.startswith(_SKIP) or module == "kvstack.metrics":
            continue
        if _DECLARES.search(path.read_text(encoding="utf-8")):
            modules.append(module.removesuffix(".__init__"))
    return modules


def kvstack_metrics(registry: CollectorRegistry = REGISTRY) -> dict[str, str]:
    """``{name: type}`` of kvstack's metrics after importing every module that declares some."""
    for module in kvstack_metric_modules():
        importlib.import_module(module)
    return {
        family.name: family.type
        for family in registry.collect()
        if family.name.startswith("kvstack_")
    }


def connector_metrics(stats_source: str) -> dict[str, str]:
    """``{name: type}`` of the metrics the connector's stats module registers in vLLM."""
    tree = ast.parse(stats_source)
    literals = _module_literals(tree)
    found: dict[str, str] = {}
    _collect_names(tree, literals, {}, found)
    return found


def vllm_metrics_from_source(loggers_source: str) -> dict[str, str]:
    """``{name: type}`` of the ``vllm:*`` metrics that vLLM's Prometheus logger creates.

    Each ``name="vllm:..."`` (or ``name = "vllm:..."``) is typed by the nearest metric
    constructor (``self._gauge_cls(`` ...) before it, or after it for a name assigned first.
    """
    found: dict[str, str] = {}
    ctor = re.compile(r"_(counter|gauge|histogram)_cls\(")
    for match in re.finditer(r"\bname\s*=\s*\"(vllm:[a-zA-Z0-9_:]+)\"", loggers_source):
        before = list(ctor.finditer(loggers_source, max(0, match.start() - 200), match.start()))
        after = ctor.search(loggers_source, match.end(), match.end() + 600)
        kind = before[-1] if before else after
        if kind is not None:
            found[match.group(1)] = kind.group(1)
    return found


def parse_metric_list(text: str) -> dict[str, str]:
    """Read a ``TYPE NAME`` per line list (``#`` comments) into ``{name: type}``."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, name = line.partition(" ")
        if kind not in METRIC_TYPES or not name.strip():
            raise ValueError(f"line {number}: expected 'TYPE NAME', got {line!r}")
        out[name.strip()] = kind
    return out


def all_exported(metrics: Iterable[dict[str, str]]) -> set[str]:
    """Every sample name of every metric in the given ``{name: type}`` maps."""
    names: set[str] = set()
    for group in metrics:
        for name, kind in group.items():
            names |= exported_names(name, kind)
    return names


# -- static evaluation of the connector's stats module -------------------------------------------
Env = dict[str, list[str]]


def _module_literals(tree: ast.Module) -> dict[str, object]:
    """Module-level ``NAME = <literal>`` (or ``NAME: T = <literal>``) assignments."""
    literals: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                literals[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    return literals


def _iter_values(node: ast.expr, literals: dict[str, object]) -> list[str]:
    """The string values a comprehension iterates over: ``X``, ``X.items()`` or a literal."""
    call = node.func if isinstance(node, ast.Call) else None
    if isinstance(call, ast.Attribute) and call.attr in ("items", "keys"):
        node = call.value
    if isinstance(node, ast.Name):
        value = literals.get(node.id, ())
    else:
        try:
            value = ast.literal_eval(node)
        except ValueError:
            return []
    if not isinstance(value, dict | tuple | list):
        return []
    return [v for v in value if isinstance(v, str)]


def _bind(comp: ast.DictComp | ast.ListComp | ast.SetComp | ast.GeneratorExp,
          literals: dict[str, object], env: Env) -> Env:  # fmt: skip
    bound = dict(env)
    for gen in comp.generators:
        target = gen.target.elts[0] if isinstance(gen.target, ast.Tuple) else gen.target
        if isinstance(target, ast.Name):
            bound[target.id] = _iter_values(gen.iter, literals)
    return bound


def _collect_names(node: ast.AST, literals: dict[str, object], env: Env,
                   found: dict[str, str]) -> None:  # fmt: skip
    if isinstance(node, ast.DictComp | ast.ListComp | ast.SetComp | ast.GeneratorExp):
        env = _bind(node, literals, env)
    if isinstance(node, ast.Call):
        kind = _constructor_kind(node.func)
        name_arg = next((k.value for k in node.keywords if k.arg == "name"), None)
        if kind and name_arg is not None:
            for name in _render(name_arg, env):
                found[name] = kind
    for child in ast.iter_child_nodes(node):
        _collect_names(child, literals, env, found)


def _constructor_kind(func: ast.expr) -> str | None:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return next((k for k in ("counter", "gauge", "histogram") if k in name.lower()), None)


def _render(node: ast.expr, env: Env) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if not isinstance(node, ast.JoinedStr):
        return []
    names = [""]
    for part in node.values:
        if isinstance(part, ast.Constant):
            names = [n + str(part.value) for n in names]
        elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name):
            names = [n + v for n in names for v in env.get(part.value.id, [])]
        else:
            return []
    return names
