"""Docs are tests: every command and config block of README.md, docs/*.md and
benchmarks/README.md runs here as written, on simulated engines, or says in the doc why it
cannot; every file under examples/ loads with kvstack's own config loader.

A block's marker is an HTML comment on the line before its fence (invisible when rendered)::

    <!-- docs-test: run [timeout=SECONDS] [sub="TEXT=>REPLACEMENT"]... [serve="PREFIX"]... -->
    <!-- docs-test: config [sub="TEXT=>REPLACEMENT"]... -->
    <!-- docs-test: skip reason="WHY IT CANNOT RUN IN CI" -->

- ``run`` (```bash, ```sh, ```shell, ```console: its ``$`` lines): the block runs in
  ``bash -e -o pipefail`` and must exit 0 within ``timeout`` seconds (default 30).
- ``config`` (```yaml): the block loads with :func:`kvstack.config.load_config`; when its first
  line names a file (``# router.yaml``) it is also written there for the blocks after it.
- ``skip``: the block cannot run in CI; ``reason`` says why (a GPU, a cluster, minutes of load).
- ``sub``: replace TEXT by REPLACEMENT before running (a stand-in for a host that is not here,
  a port that is free). Placeholders in REPLACEMENT: ``{port}``, one free port per document;
  ``{sim1}``, ``{sim2}``: simulated engines serving ``support-v1`` and ``support-v2``.
- ``serve``: a line starting with PREFIX is a server the reader leaves running; it runs in the
  background, the next line waits until ``{port}`` accepts connections, and it is stopped when
  the block ends.

A ```bash, ```sh, ```shell, ```console or ```yaml block without a marker fails the test, so does
an untagged fence (```text for a picture or a protocol sketch, ```json for a message). The
blocks of one document run in order in one directory that sees the checkout's files; stacks
they leave running are stopped with ``kvstack down``'s own code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvstack.config import load_config
from kvstack.errors import KVStackError
from kvstack.stack.ports import free_port
from kvstack.stack.supervisor import STATE_FILE, stop_run_dir
from tests.docs_blocks import DOCS, ROOT, Block, MarkerError, console_commands, read_blocks

# Waits for a `serve` line's server: bash's own /dev/tcp, no extra tool.
PREAMBLE = """_docs_wait() {
  for _ in $(seq 1 300); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "nothing listens on port $1 after 30 s:" >&2; cat .docs-serve.log >&2; return 1
}
"""
LEFT_OUT = {"bench-results"}  # the checkout's entries a document's directory does not see


class SimEngines:
    """Two simulated engines, started on first use, for the docs' stand-ins."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.urls: dict[str, str] = {}

    def values(self) -> dict[str, str]:
        if not self.urls:
            for n in (1, 2):
                port = free_port()
                argv = [sys.executable, "-m", "kvstack", "sim-engine", "--host", "127.0.0.1",
                        "--port", str(port), "--model", f"support-v{n}"]  # fmt: skip
                self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.DEVNULL))  # fmt: skip
                self.urls[f"sim{n}"] = f"http://127.0.0.1:{port}"
            for url in self.urls.values():
                _wait_healthy(url)
        return self.urls

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=10)


def _wait_healthy(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"simulated engine at {url} not healthy after {timeout_s} s")


@pytest.fixture(scope="module")
def sims() -> Iterator[SimEngines]:
    engines = SimEngines()
    yield engines
    engines.stop()


EXAMPLES = sorted(ROOT.glob("examples/**/*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[str(p.relative_to(ROOT)) for p in EXAMPLES])
def test_every_example_file_loads(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Examples are configs: kvstack's, or LMCache's that the connector reads as they are."""
    for name in [n for n in os.environ if n.startswith(("KVSTACK_", "LMCACHE_"))]:
        monkeypatch.delenv(name)
    if path.parent.name == "lmcache":
        from kvstack.integrations.settings import split_extra_config

        monkeypatch.setenv("LMCACHE_CONFIG_FILE", str(path))
        assert split_extra_config({})[1].tiers
    else:
        assert load_config(path, env={}).stack.engines


def test_every_command_and_config_block_is_run_or_marked_with_why() -> None:
    problems: list[str] = []
    for doc in DOCS:
        try:
            read_blocks(doc)
        except MarkerError as exc:
            problems.append(str(exc))
    assert not problems, "\n".join(problems)


def _runs_something(doc: str) -> bool:
    try:
        return any(b.marker and b.marker.action != "skip" for b in read_blocks(doc))
    except MarkerError:
        return True  # the run below reports it


@pytest.mark.parametrize("doc", [d for d in DOCS if _runs_something(d)])
def test_the_doc_runs_as_written(doc: str, tmp_path: Path, sims: SimEngines) -> None:
    blocks = [b for b in read_blocks(doc) if b.marker and b.marker.action != "skip"]
    workdir = _checkout_view(tmp_path)
    values = {"port": str(free_port())}
    env = _environment(workdir)
    try:
        for block in blocks:
            if any("{sim" in new for _, new in block.marker.subs if block.marker):
                values.update(sims.values())
            if block.marker and block.marker.action == "config":
                _check_config(block, workdir, values)
            else:
                _run_shell(block, workdir, values, env)
    finally:
        _stop_stacks(workdir)


def _checkout_view(tmp: Path) -> Path:
    """A directory where the checkout's files are at hand (``benchmarks/compare/tiny.yaml``) and
    whatever the commands write stays out of the checkout."""
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name not in LEFT_OUT:
            (tmp / entry.name).symlink_to(entry)
    return tmp


def _environment(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTACK_")}
    if "KVSTACK_MODELS_DIR" in os.environ:  # where the toy model is built once per machine
        env["KVSTACK_MODELS_DIR"] = os.environ["KVSTACK_MODELS_DIR"]
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env["XDG_STATE_HOME"] = str(workdir / ".state")  # `kvstack down` without flags, kept here
    return env


def _check_config(block: Block, workdir: Path, values: dict[str, str]) -> None:
    path = workdir / (block.file_name or ".docs-fragment.yaml")
    path.write_text(block.substituted(values))
    try:
        load_config(path, env={})
    except (KVStackError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        pytest.fail(f"{block.where}: kvstack's config loader refuses it: {exc}")


def _script(block: Block, values: dict[str, str]) -> str:
    text = block.substituted(values)
    if block.lang == "console":
        text = console_commands(text)
    serve = block.marker.serve if block.marker else ()
    lines = []
    for line in text.splitlines():
        if serve and line.strip().startswith(serve):
            line = f"{line} > .docs-serve.log 2>&1 &\n_docs_wait {values['port']}"
        lines.append(line)
    return PREAMBLE + "\n".join(lines) + "\n"


def _run_shell(block: Block, workdir: Path, values: dict[str, str], env: dict[str, str]) -> None:
    assert block.marker is not None
    argv = ["bash", "-e", "-o", "pipefail", "-x", "-c", _script(block, values)]
    proc = subprocess.Popen(
        argv,
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    started = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=block.marker.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{block.where}: still running after {block.marker.timeout:g} s\n{out[-4000:]}")
    finally:
        _end_group(proc.pid)
    took = time.monotonic() - started
    print(f"{block.where}: {took:.1f} s")  # with -s: where the docs test spends its time
    assert proc.returncode == 0, (
        f"{block.where}: exit {proc.returncode} after {took:.1f} s\n{out[-4000:]}"
    )


def _end_group(pgid: int) -> None:
    """The block's background servers (its process group) end with it."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def _stop_stacks(workdir: Path) -> None:
    for folder, _dirs, files in os.walk(workdir):  # symlinks (the checkout) are not followed
        if STATE_FILE in files:
            stop_run_dir(Path(folder))
