"""Fixtures: every values set the deploy tests check, rendered once per session."""

from __future__ import annotations

import pytest

from kvstack.deploy.chart import ChartManifest
from tests.deploy.rendered import VALUE_SETS, rendered


@pytest.fixture(params=sorted(VALUE_SETS))
def values_set(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def manifests(values_set: str) -> tuple[ChartManifest, ...]:
    return rendered(values_set)
