"""Fixtures for the benchmark tests: the simulator fleets of tests/sim."""

from __future__ import annotations

from tests.sim.conftest import FleetFactory, SimProcessFactory, sim_fleet, sim_process

__all__ = ["FleetFactory", "SimProcessFactory", "sim_fleet", "sim_process"]
