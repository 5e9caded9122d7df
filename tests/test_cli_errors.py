"""A newcomer's mistakes end as one line on stderr naming the cause, where the value came from
and the fix (never a traceback), with a non-zero exit; ``--debug`` shows the traceback.

Each case runs the real ``kvstack`` command in a subprocess, as a user would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvstack.cli import one_line_error
from kvstack.errors import ConfigError
from kvstack.stack.ports import free_port


def kvstack(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTACK_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "kvstack", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=full_env,
    )


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    """stderr without the log lines (``HH:MM:SS LEVEL name: ...``) a component prints first."""
    return [
        line
        for line in result.stderr.splitlines()
        if line.strip() and not (line[:2].isdigit() and line[2:3] == ":")
    ]


def assert_one_line(result: subprocess.CompletedProcess[str], *parts: str) -> str:
    lines = error_lines(result)
    assert result.returncode != 0, result.stderr
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert all(part in lines[0] for part in parts), lines[0]
    return lines[0]


@pytest.fixture()
def typo(tmp_path: Path) -> Path:
    path = tmp_path / "typo.yaml"
    path.write_text("router:\n  prot: 9000\n")
    return path


@pytest.fixture()
def routr(tmp_path: Path) -> Path:
    path = tmp_path / "routr.yaml"
    path.write_text("routr:\n  port: 9000\n")
    return path


def test_config_show_with_a_typo_names_file_key_and_the_fix(typo: Path) -> None:
    assert_one_line(
        kvstack("config", "show", "--config", str(typo)),
        f"{typo}: router.prot: unknown key",
        "did you mean 'port'?",
    )


def test_an_environment_variable_error_names_the_variable() -> None:
    line = assert_one_line(
        kvstack("config", "show", env={"KVSTACK_ROUTER_PORT": "abc"}),
        "environment variable KVSTACK_ROUTER_PORT",
        "valid integer",
    )
    assert "router.port" not in line
    assert_one_line(
        kvstack("config", "show", env={"KVSTACK_ROUTER_BACKENDS": "http://a:8000"}),
        "KVSTACK_ROUTER_BACKENDS",
        "are JSON",
    )


@pytest.mark.parametrize("command", [["router"], ["up", "--no-progress"], ["config", "show"]])
def test_an_unknown_top_level_section_is_an_error_everywhere(
    routr: Path, command: list[str]
) -> None:
    assert_one_line(
        kvstack(*command, "--config", str(routr)),
        "unknown top-level section 'routr'",
        "did you mean 'router'?",
    )


def test_a_bad_tier_url_in_sim_engine() -> None:
    port = str(free_port())
    assert_one_line(
        kvstack("sim-engine", "--port", port, "--kv-tiers", "foo://x"),
        "--kv-tiers",
        "unknown tier scheme 'foo'",
    )


def test_bench_serve_against_a_dead_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    args = ("bench", "serve", "--url", url, "--workload", "unique", "--rate", "5")
    assert_one_line(
        kvstack(*args, "--duration", "1", "--no-progress"),
        f"cannot connect to 127.0.0.1:{url.rsplit(':', 1)[1]}",
        "connection refused",
    )


def test_debug_shows_the_traceback(typo: Path) -> None:
    for result in (
        kvstack("--debug", "config", "show", "--config", str(typo)),
        kvstack("config", "show", "--config", str(typo), env={"KVSTACK_DEBUG": "1"}),
    ):
        assert result.returncode != 0
        assert "Traceback (most recent call last)" in result.stderr
        assert "router.prot: unknown key" in result.stderr


def test_bugs_are_not_hidden_behind_one_line() -> None:
    assert one_line_error(KeyError("x")) is None
    assert one_line_error(ConfigError("bad")) is not None
    assert one_line_error(ConnectionRefusedError(111, "refused")) is not None
