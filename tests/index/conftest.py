"""An index server on a thread of the test process, on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvstack.index.config import IndexServiceConfig
from kvstack.index.runner import IndexServerThread
from tests.conftest import free_port


@pytest.fixture
def index_server() -> Iterator[IndexServerThread]:
    server = IndexServerThread(IndexServiceConfig(port=free_port(), instance_ttl_s=30)).start()
    yield server
    server.stop()
