"""Fixtures for the simulator tests: in-process fleets on free ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from kvstack.sim.config import SimConfig
from kvstack.sim.server import EngineSpec, FleetThread
from tests.conftest import free_port

FleetFactory = Callable[..., FleetThread]


@pytest.fixture
def sim_fleet() -> Iterator[FleetFactory]:
    """``sim_fleet(num=1, **config)`` starts engines in a background thread; stopped at teardown."""
    with ExitStack() as stack:

        def start(num: int = 1, **config: Any) -> FleetThread:
            cfg = SimConfig(**config)
            specs = [EngineSpec(cfg, free_port()) for _ in range(num)]
            return stack.enter_context(FleetThread(specs))

        yield start
