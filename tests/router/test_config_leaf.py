"""The router's config is a leaf: importing it loads config modules and leaves, never the
router's runtime (backends, pipeline, proxy, HTTP)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import kvstack

SRC = Path(kvstack.__file__).resolve().parent


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
