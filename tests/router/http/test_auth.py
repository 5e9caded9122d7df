"""API keys: the keys file format, auth off without keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstack.errors import ConfigError
from kvstack.router.config import AuthConfig
from kvstack.router.http.auth import ApiKeys, parse_keys_file


def test_api_key_file_format(tmp_path: Path) -> None:
    keys = parse_keys_file("k1 t1\n\n# comment\nk2   # no tenant\n")
    assert sorted(keys.values()) == ["default", "t1"]
    with pytest.raises(ConfigError, match=":1: expected 'KEY \\[TENANT\\]'"):
        parse_keys_file("a b c\n", "keys")
    with pytest.raises(ConfigError, match="cannot load API keys"):
        ApiKeys(AuthConfig(api_keys_file=str(tmp_path / "missing")))
    off = ApiKeys(AuthConfig())
    assert not off.enabled and off.tenant({}) is None
