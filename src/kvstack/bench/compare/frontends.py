"""Front ends for ``bench compare``: commands with placeholders, presets, child processes.

Placeholders in a command's arguments:

- inside an argument: ``{port}``, ``{host}``, ``{python}``, ``{model}``, ``{block_size}``,
  ``{backends_csv}`` (engine URLs joined by commas), ``{free_port}`` (another free port, e.g.
  for a metrics listener);
- as a whole argument, expanding to several: ``{backends}`` (the engine URLs),
  ``{backend_flags}`` (``--backend URL`` per engine), ``{event_endpoints}`` (KV event
  endpoints), ``{kv_event_sources}`` (``--kv-event-source URL=ENDPOINT`` per engine,
  vllm-router's form).

Presets: ``rr-proxy`` (bench's round-robin proxy), ``kvstack-router:POLICY`` and
``vllm-router:POLICY``; ``vllm-router:kv_aware`` also gets the engines' KV event sources.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from kvstack.bench.compare.experiment import FrontendSpec
from kvstack.bench.compare.fleet import BenchFleet
from kvstack.errors import ConfigError
from kvstack.stack.ports import free_port
from kvstack.stack.procs import ManagedProcess

__all__ = ["FrontendProcess", "expand_command", "preset_command"]


def _vllm_router() -> str:
    """The ``vllm-router`` next to this interpreter (a venv's bin), else on PATH."""
    local = Path(sys.executable).with_name("vllm-router")
    if local.exists():
        return str(local)
    return shutil.which("vllm-router") or "vllm-router"


def preset_command(preset: str) -> list[str]:
    kind, _, policy = preset.partition(":")
    if kind == "rr-proxy" and not policy:
        return [
            "{python}",
            "-m",
            "kvstack.bench.compare.rr_proxy",
            "--port",
            "{port}",
            "{backends}",
        ]
    if kind == "kvstack-router" and policy:
        return [
            "{python}",
            "-m",
            "kvstack",
            "router",
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--policy",
            policy,
            "{backend_flags}",
        ]
    if kind == "vllm-router" and policy:
        command = [
            _vllm_router(),
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--policy",
            policy,
            "--log-level",
            "warning",
            # Its Prometheus exporter binds a fixed port (29000) unless told otherwise.
            "--prometheus-host",
            "{host}",
            "--prometheus-port",
            "{free_port}",
            "--worker-urls",
            "{backends}",
        ]
        if policy == "kv_aware":
            command += [
                "{kv_event_sources}",
                "--kv-event-block-size",
                "{block_size}",
                "--kv-event-model",
                "{model}",
            ]
        return command
    raise ConfigError(
        f"unknown frontend preset {preset!r}; use rr-proxy, kvstack-router:POLICY or "
        "vllm-router:POLICY"
    )


def expand_command(command: list[str], fleet: BenchFleet, port: int) -> list[str]:
    """Fill the placeholders of ``command`` for ``fleet`` and a front-end ``port``."""
    urls, events = fleet.urls, fleet.event_endpoints
    lists = {
        "{backends}": urls,
        "{backend_flags}": [x for url in urls for x in ("--backend", url)],
        "{event_endpoints}": events,
        "{kv_event_sources}": [
            x
            for url, ep in zip(urls, events, strict=False)
            for x in ("--kv-event-source", f"{url}={ep}")
        ],
    }
    if ("{event_endpoints}" in command or "{kv_event_sources}" in command) and not events:
        raise ConfigError("the frontend needs KV events: set fleet.kv_events: true")
    values = {
        "port": str(port),
        "host": "127.0.0.1",
        "python": sys.executable,
        "model": fleet.model,
        "block_size": str(fleet.block_size),
        "backends_csv": ",".join(urls),
    }
    out: list[str] = []
    for arg in command:
        if arg in lists:
            out += lists[arg]
            continue
        try:
            out.append(arg.format(**values, free_port=free_port()))
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"bad placeholder in frontend argument {arg!r}: {exc}") from None
    return out


class FrontendProcess:
    """A front end started for one run: ``with FrontendProcess(spec, fleet, logs) as url``."""

    def __init__(self, spec: FrontendSpec, fleet: BenchFleet, log_path: Path, timeout_s: float):
        self.spec = spec
        self.port = free_port()
        command = spec.command or preset_command(spec.preset or "")
        self.argv = expand_command(command, fleet, self.port)
        self.proc = ManagedProcess(
            f"frontend {spec.name}", self.argv, log_path, env=os.environ | spec.env
        )
        self.timeout_s = timeout_s

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> str:
        self.proc.start()
        try:
            self.proc.wait_healthy(self.url + self.spec.health_path, self.timeout_s)
        except BaseException:
            self.proc.stop()
            raise
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.proc.stop(grace_s=5)
