"""``kvstack deploy``: review what the Helm chart would deploy, without a cluster.

    kvstack deploy render -f deploy/examples/gpu-fleet.yaml --namespace llm
    kvstack deploy render -f my-values.yaml --set router.replicas=3 --validate
    kvstack deploy render -f my-values.yaml --output-dir rendered/
    kvstack deploy vllm-metrics > tests/deploy/vllm_metrics.txt
    kvstack deploy import-production-stack prod-stack-values.yaml -o kvstack-values.yaml

``render`` prints the manifests as one YAML stream (or writes one file per object);
``--validate`` also runs ``helm lint --strict`` and checks every object against the
Kubernetes OpenAPI schemas (and the KEDA / prometheus-operator CRD schemas).
``vllm-metrics`` lists the metric names of the installed vLLM, for the dashboard checks.
``import-production-stack`` writes the kvstack values equivalent to a production-stack values
file and lists, on stderr, each value that has no equivalent and why
(:mod:`kvstack.deploy.production_stack`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from kvstack.deploy.chart import (
    CHART_DIR,
    ChartError,
    ChartManifest,
    lint_chart,
    load_values,
    render_chart,
)
from kvstack.errors import ConfigError, MissingExtraError

__all__ = ["run"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack deploy", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    r = sub.add_parser("render", help="render the chart with the given values")
    r.add_argument("-f", "--values", action="append", default=[], help="values file (repeatable)")
    r.add_argument("--set", action="append", default=[], metavar="K=V", help="a value (repeatable)")
    r.add_argument("--name", default="kvstack", help="release name (default kvstack)")
    r.add_argument("--namespace", default="default", help="namespace (default default)")
    r.add_argument("--chart", type=Path, default=CHART_DIR, help="chart directory")
    r.add_argument("--output-dir", type=Path, help="write one file per object here")
    r.add_argument("--validate", action="store_true", help="also lint and schema-validate")
    r.add_argument("--kube-version", help="Kubernetes version to validate against")
    v = sub.add_parser("vllm-metrics", help="list the installed vLLM's metric names")
    v.add_argument("--source", type=Path, help="vllm/v1/metrics/loggers.py (default: installed)")
    i = sub.add_parser(
        "import-production-stack", help="kvstack values from production-stack Helm values"
    )
    i.add_argument("values", type=Path, help="production-stack values file")
    i.add_argument("-o", "--output", type=Path, help="write the kvstack values here (stdout)")
    return p


def run(command: str, argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.action == "vllm-metrics":
            return _vllm_metrics(args.source)
        if args.action == "import-production-stack":
            return _import(args.values, args.output)
        return _render(args)
    except (ChartError, ConfigError, MissingExtraError) as exc:
        print(f"kvstack {command}: {exc}", file=sys.stderr)
        return 2


def _render(args: argparse.Namespace) -> int:
    values = load_values(args.values, args.set)
    manifests = render_chart(values, chart_dir=args.chart, release=args.name,
                             namespace=args.namespace)  # fmt: skip
    if args.output_dir:
        _write_files(manifests, args.output_dir)
    else:
        yaml.safe_dump_all([m.doc for m in manifests], sys.stdout, sort_keys=False)
    return _validate(args, values, manifests) if args.validate else 0


def _validate(
    args: argparse.Namespace, values: dict[str, Any], manifests: list[ChartManifest]
) -> int:
    from kvstack.deploy.validate import DEFAULT_KUBE_VERSION, validate_manifests

    version = args.kube_version or DEFAULT_KUBE_VERSION
    lint = lint_chart(values, chart_dir=args.chart, namespace=args.namespace,
                      kube_version=f"v{version.lstrip('v')}")  # fmt: skip
    problems = [f"lint: {e}" for e in lint.errors + lint.warnings]
    problems += validate_manifests(manifests, version)
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{len(manifests)} objects, {len(problems)} problems (Kubernetes {version})",
          file=sys.stderr)  # fmt: skip
    return 1 if problems else 0


def _write_files(manifests: list[ChartManifest], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for number, m in enumerate(manifests):
        path = out / f"{number:03d}-{m.kind.lower()}-{m.name}.yaml"
        path.write_text(yaml.safe_dump(m.doc, sort_keys=False))
    print(f"wrote {len(manifests)} files to {out}", file=sys.stderr)


def _vllm_metrics(source: Path | None) -> int:
    from kvstack.deploy.metric_names import vllm_metrics_from_source

    if source is None:
        import importlib.util

        spec = importlib.util.find_spec("vllm")
        if spec is None or spec.origin is None:
            raise MissingExtraError("vLLM is not installed; pass --source .../loggers.py")
        source = Path(spec.origin).parent / "v1" / "metrics" / "loggers.py"
    metrics = vllm_metrics_from_source(source.read_text())
    print("# vLLM's Prometheus metrics (TYPE NAME), from vllm/v1/metrics/loggers.py.")
    print("# Regenerate: kvstack deploy vllm-metrics > tests/deploy/vllm_metrics.txt")
    for name, kind in sorted(metrics.items()):
        print(f"{kind} {name}")
    return 0


def _import(source: Path, output: Path | None) -> int:
    from kvstack.deploy.production_stack import import_production_stack

    try:
        data = yaml.safe_load(source.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {str(source)!r}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{str(source)!r} must hold a mapping of Helm values")
    result = import_production_stack(data)
    header = f"# kvstack chart values imported from production-stack values {source.name}\n"
    text = header + yaml.safe_dump(result.values, sort_keys=False)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
    print(f"{len(result.unmapped)} production-stack values have no kvstack equivalent"
          + (":" if result.unmapped else ""), file=sys.stderr)  # fmt: skip
    for line in result.unmapped:
        print(f"  {line}", file=sys.stderr)
    return 0
