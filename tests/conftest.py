"""Fixtures shared by every test package."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstack.stack.ports import free_port


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def toy_model() -> Path:
    """The TINY random-weight float16 Llama + tokenizer (built once per machine, cached)."""
    from kvstack.models.toy import build_toy_model

    return build_toy_model()
