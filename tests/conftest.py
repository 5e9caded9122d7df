"""Fixtures shared by every test package."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstack.stack import ports


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (:func:`kvstack.stack.ports.free_port`)."""
    return ports.free_port()


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def toy_model() -> Path:
    """The TINY random-weight float16 Llama + tokenizer (built once per machine, cached)."""
    from kvstack.models.toy import build_toy_model

    return build_toy_model()
