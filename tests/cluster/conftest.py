"""Fixtures of the cluster tests: the index server and the real redis-server of the index
tests."""

from __future__ import annotations

from tests.index.conftest import index_server, redis_server

__all__ = ["index_server", "redis_server"]
