"""The paged KV kernels: unused where they cannot run, and byte-exact where they do (Triton's
interpreter on CPU tensors, in a process of its own: ``kernels_interpreted.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvstack.bench.micro.paged_layouts import PagedShape, build_paged
from kvstack.integrations.vllm import paged_kernels

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="interpreter on")
def test_on_cpu_tensors_the_kernels_are_not_used() -> None:
    shape = PagedShape("tiny", 2, 1, 8, 4, torch.bfloat16)
    alloc = build_paged(shape, "per-layer", 4, torch.device("cpu"))
    assert not paged_kernels.kernels_usable(alloc.paged)


@pytest.mark.slow
def test_the_kernels_move_exactly_the_planned_pages_in_the_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(HERE / "kernels_interpreted.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=500,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout
