"""Child processes with logs, health waits and clean teardown (used by ``kvstack up`` and tests).

``ManagedProcess`` starts a command in its own session (process group) with stdout and stderr in
a log file, waits for an HTTP health URL, and on ``stop()`` sends SIGTERM to the whole group,
then SIGKILL after a grace period, so no grandchild (vLLM's engine core and workers) is left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvstack.errors import StackError

__all__ = ["ManagedProcess", "log_tail", "wait_http_ok"]

log = logging.getLogger(__name__)


def wait_http_ok(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``url`` until it answers 200; raise StackError on timeout or if ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise StackError(f"process exited with code {proc.returncode} before {url} was healthy")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if time.monotonic() > deadline:
            raise StackError(f"{url} not healthy after {timeout_s:.0f} s")
        time.sleep(0.25)


def log_tail(path: Path, num_lines: int = 30) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-num_lines:])


class ManagedProcess:
    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        cpus: Sequence[int] = (),
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.cpus = frozenset(cpus)  # CPU affinity of the process; empty: inherited
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        self._pin()
        log.info("started %s (pid %d): %s", self.name, self.proc.pid, " ".join(self.argv))
        return self

    def _pin(self) -> None:
        """Set the CPU affinity right after the start (threads and children started later
        inherit it; the process has barely begun importing by then)."""
        if not self.cpus or self.proc is None or not hasattr(os, "sched_setaffinity"):
            return
        try:
            os.sched_setaffinity(self.proc.pid, self.cpus)
        except OSError as exc:  # CPUs offline or outside the cgroup: run unpinned, say so
            log.warning("%s: cannot pin to CPUs %s: %s", self.name, sorted(self.cpus), exc)

    def wait_healthy(self, url: str, timeout_s: float) -> None:
        try:
            wait_http_ok(url, timeout_s, self.proc)
        except StackError as exc:
            tail = log_tail(self.log_path)
            raise StackError(
                f"{self.name}: {exc}\n--- last lines of {self.log_path} ---\n{tail}"
            ) from None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL what is left after ``grace_s``."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # grandchildren that ignored SIGTERM
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def __enter__(self) -> ManagedProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
