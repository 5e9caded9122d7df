"""The peer tier's locator seam: found by name, and a missing ``server`` extra named in one line."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kvstack.errors import ConfigError
from kvstack.kv.tiers.peer.locator import make_locator

BLOCKED = """
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("msgspec", "httpx"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Refuse())
"""


def test_an_index_locator_without_the_server_extra_names_it() -> None:
    script = BLOCKED + textwrap.dedent("""
        from kvstack.errors import MissingExtraError
        from kvstack.kv.tiers import make_tier
        try:
            make_tier("peer://?index=http://127.0.0.1:1&self=a")
        except MissingExtraError as exc:
            print(exc)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "pip install 'kvstack[server]'" in lines[0], proc.stdout


def test_unknown_locators_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown peer locator 'dns'"):
        make_locator("dns", "dns://x", 1.0)
