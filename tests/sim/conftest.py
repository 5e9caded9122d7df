"""Fixtures for the simulator tests: fleets in-process (fast to inspect) or as a child process
(the test process then has its CPU to itself, for timing)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from kvstack.sim.config import SimConfig
from kvstack.sim.server import FleetThread, SimEngineSpec
from kvstack.stack.ports import free_port, free_port_run
from kvstack.stack.procs import ManagedProcess

FleetFactory = Callable[..., FleetThread]


@pytest.fixture
def sim_fleet() -> Iterator[FleetFactory]:
    """``sim_fleet(num=1, **config)`` starts engines in a background thread; stopped at teardown."""
    with ExitStack() as stack:

        def start(num: int = 1, **config: Any) -> FleetThread:
            cfg = SimConfig(**config)
            specs = [SimEngineSpec(cfg, free_port()) for _ in range(num)]
            return stack.enter_context(FleetThread(specs))

        yield start


SimProcessFactory = Callable[..., list[str]]


@pytest.fixture
def sim_process(tmp_path: Path) -> Iterator[SimProcessFactory]:
    """``sim_process(engines=1, **flags)`` runs ``kvstack sim-engine`` as a child process (the
    load generator then has this process to itself); returns the engine URLs."""
    procs: list[ManagedProcess] = []

    def start(engines: int = 1, **flags: Any) -> list[str]:
        base = free_port_run(engines)
        argv = [
            sys.executable,
            "-m",
            "kvstack",
            "sim-engine",
            "--fleet",
            str(engines),
            "--base-port",
            str(base),
        ]
        for key, value in flags.items():
            flag = key.replace("_", "-")
            if isinstance(value, bool):
                argv.append(f"--{flag}" if value else f"--no-{flag}")
            else:
                argv += [f"--{flag}", str(value)]
        proc = ManagedProcess("sim", argv, tmp_path / f"sim-{base}.log")
        procs.append(proc.start())
        urls = [f"http://127.0.0.1:{base + i}" for i in range(engines)]
        for url in urls:
            proc.wait_healthy(url + "/health", 30)
        return urls

    yield start
    for proc in procs:
        proc.stop(grace_s=5)
