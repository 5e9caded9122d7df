"""Fixtures shared by every test package."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def toy_model() -> Path:
    """The TINY random-weight float16 Llama + tokenizer (built once per machine, cached)."""
    from kvstack.models.toy import build_toy_model

    return build_toy_model()
