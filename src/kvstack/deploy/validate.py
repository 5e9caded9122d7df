"""Validate rendered manifests against Kubernetes' OpenAPI schemas, offline.

Built-in kinds use ``kubernetes-validate`` (strict: unknown fields are errors) for a given
Kubernetes version. The custom resources the chart may render (KEDA's ScaledObject,
prometheus-operator's ServiceMonitor and PodMonitor) are checked against JSON schemas derived
from the ``cloudcoil`` models generated from those projects' CRDs, made strict the same way.
No package ships the Gateway API Inference Extension's or the Gateway API's CRDs as schemas, so
the InferencePool and HTTPRoute the endpoint picker mode renders are checked against JSON
schemas written by hand from the published CRDs' documented fields (``deploy/crds/*.json``:
names, patterns, bounds, required fields), strict as well.
A kind with no schema at all is a problem, not a pass.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kvstack.deploy.chart import ChartManifest
from kvstack.errors import require

__all__ = [
    "CRD_FILES",
    "CRD_MODELS",
    "DEFAULT_KUBE_VERSION",
    "crd_schema",
    "validate_manifests",
]

# A current release kubernetes-validate ships schemas for (it has 1.25 up to 1.37).
DEFAULT_KUBE_VERSION = "1.34.0"

# (apiVersion, kind) -> "module:Class" of a cloudcoil model generated from the CRD.
_MONITORING = "cloudcoil.models.prometheus_operator.v1"
CRD_MODELS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "cloudcoil.models.keda.v1alpha1:ScaledObject",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): f"{_MONITORING}:ServiceMonitor",
    ("monitoring.coreos.com/v1", "PodMonitor"): f"{_MONITORING}:PodMonitor",
}
# (apiVersion, kind) -> a hand-written JSON schema beside this module.
_CRDS = Path(__file__).with_name("crds")
CRD_FILES = {
    ("inference.networking.k8s.io/v1", "InferencePool"): _CRDS / "inferencepool-v1.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): _CRDS / "httproute-v1.json",
}


def validate_manifests(
    manifests: Iterable[ChartManifest], kube_version: str = DEFAULT_KUBE_VERSION
) -> list[str]:
    """One line per problem; an empty list means every manifest is valid."""
    problems = []
    for manifest in manifests:
        problems += [f"{manifest}: {p}" for p in _validate(manifest.doc, kube_version)]
    return problems


def _validate(doc: dict[str, Any], kube_version: str) -> list[str]:
    key = (doc.get("apiVersion", ""), doc.get("kind", ""))
    if key in CRD_MODELS or key in CRD_FILES:
        return _validate_crd(doc, crd_schema(*key))
    kv: Any = require("kubernetes_validate", "deploy")
    try:
        kv.validate(doc, kube_version, strict=True)
    except kv.SchemaNotFoundError:
        return [f"no schema for {key[1]} {key[0]} in Kubernetes {kube_version}"]
    except kv.ValidationError as exc:
        path = "/".join(str(p) for p in exc.path)
        return [f"at {path or '.'}: {exc.message}"]
    return []


def _validate_crd(doc: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    from jsonschema import Draft202012Validator

    errors = sorted(Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    return [f"at {'/'.join(str(p) for p in e.path) or '.'}: {e.message}" for e in errors]


@functools.cache
def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    """The strict JSON schema of a custom resource kind the chart renders."""
    path = CRD_FILES.get((api_version, kind))
    if path is not None:
        schema: dict[str, Any] = json.loads(path.read_text())
        _forbid_unknown(schema)
        return schema
    module_name, _, class_name = CRD_MODELS[(api_version, kind)].partition(":")
    require(module_name.rsplit(".", 1)[0], "deploy")
    model = getattr(importlib.import_module(module_name), class_name)
    schema = model.model_json_schema(by_alias=True, mode="validation")
    _forbid_unknown(schema)
    return schema


def _forbid_unknown(node: Any) -> None:
    """Unknown fields are errors (as ``kubectl apply`` with server-side field validation)."""
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _forbid_unknown(value)
    elif isinstance(node, list):
        for value in node:
            _forbid_unknown(value)
