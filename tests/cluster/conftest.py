"""Fixtures of the cluster tests: the index server of the index tests."""

from __future__ import annotations

from tests.index.conftest import index_server

__all__ = ["index_server"]
