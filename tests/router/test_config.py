"""The router section: values named in their errors; importing it loads no runtime module."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvstack
from kvstack.errors import ConfigError
from kvstack.router.config import RouterConfig

SRC = Path(kvstack.__file__).resolve().parent


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"backends": [{"url": "ftp://x"}]}, "must look like http://host:port"),
        ({"backends": [{"url": "http://x:1/v1"}]}, "must not carry a path"),
        ({"policy": "fastest"}, "policy 'fastest' is unknown; choose one of"),
        ({"port": 70000}, "less than or equal to 65535"),
        ({"retry": {"on_status": [404]}}, "5xx codes only"),
        ({"ejection": {"base_lease_s": 5, "max_lease_s": 1}}, "must be >= base_lease_s"),
        ({"limits": {"max_request_bytes": "lots"}}, "is not a size"),
        ({"models": [{"name": "a", "targets": [{"model": "x", "weight": 0}]}]}, "greater than 0"),
        ({"models": [{"name": "a", "targets": []}]}, "at least 1 item"),
        (
            {"models": [{"name": "a", "targets": [{"model": "x"}]}], "model_aliases": {"a": "y"}},
            "both as route and alias",
        ),
        ({"unknown_key": 1}, "unknown_key: unknown key"),
    ],
)
def test_config_errors_name_the_value(data: dict, message: str) -> None:
    from kvstack.section import load_section

    with pytest.raises(ConfigError, match=message):
        load_section("router", RouterConfig, data, env={})


def _loaded_by(module: str) -> list[str]:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(SRC.parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return [m for m in json.loads(out.stdout) if m.startswith("kvstack.router.")]


def _imports_router(module: str) -> bool:
    """Whether the module's source imports any other kvstack.router module."""
    path = SRC.joinpath(*module.split(".")[1:]).with_suffix(".py")
    if not path.exists():
        path = path.with_suffix("") / "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        if any(n.startswith("kvstack.router.") for n in names):
            return True
    return False


def test_importing_the_router_config_loads_only_config_modules_and_leaves() -> None:
    loaded = _loaded_by("kvstack.router.config")
    assert "kvstack.router.config" in loaded
    runtime = [m for m in loaded if not m.endswith(".config") and _imports_router(m)]
    assert runtime == [], f"the router's config pulls in runtime modules: {runtime}"
    assert not {"kvstack.router.fleet.backends", "kvstack.router.proxy"} & set(loaded)
