"""Benchmark results as files: one JSON document per ``kvstack bench …`` command.

Every benchmark ends with :func:`save`, which writes::

    {"schema": 1, "bench": "kv", "command": "kvstack bench kv --quick",
     "commit": "3109f49", "dirty": false, "measured": "2026-12-01T21:30:00Z",
     "seconds": 41.2,
     "machine": {"cpu_model": ..., "cores": 2, "memory_gib": 23.4, "python": ...,
                 "memcpy_gbps": 6.1, "loopback_gbps": 2.3},
     "result": {...every figure the benchmark printed...}}

to ``--json FILE`` when given, else to ``bench-results/<bench>/<bench>-<UTC stamp>.json``
(ignored by git). Published figures are such files committed under ``benchmarks/results/``;
``kvstack bench report`` renders the tables of ``docs/benchmarks.md`` and the README from
them.

The machine's memcpy and loopback TCP figures are measured when the document is written
(about a second), so a reader can tell a slow machine from a slow kvstack. Both are the median
of five rounds: memcpy copies 256 MiB between two ``bytearray`` buffers (one C ``memmove``),
loopback streams 128 MiB through one TCP connection on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "SCHEMA",
    "Result",
    "git_commit",
    "load",
    "machine_facts",
    "newest",
    "save",
]

SCHEMA = 1
DEFAULT_DIR = Path("bench-results")
ENVELOPE = frozenset(
    {"schema", "bench", "command", "commit", "dirty", "measured", "seconds", "machine",
     "result", "stale", "provenance"}
)  # fmt: skip
_MEMCPY_BYTES = 256 << 20
_LOOPBACK_BYTES = 128 << 20


@dataclass(frozen=True)
class Result:
    """One result document, as read back."""

    path: Path
    bench: str
    command: str
    commit: str
    measured: str
    machine: dict[str, Any]
    result: dict[str, Any]
    stale: str | None  # why the figures no longer describe main's code, when they don't
    provenance: str  # "measured" (a run wrote it) or "transcribed" (kept from an older doc)

    @property
    def day(self) -> str:
        return self.measured[:10]


def git_commit(cwd: Path | None = None) -> tuple[str, bool]:
    """The short commit of the checkout that runs, and whether its tree has changes.

    ``KVSTACK_COMMIT`` wins (an installed package has no checkout); ``"unknown"`` without git.
    """
    if env := os.environ.get("KVSTACK_COMMIT"):
        return env, False
    where = cwd or Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=where, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown", False
    return head, bool(status)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


_ISA = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "neon", "asimd", "sve")


def _cpu_flags() -> list[str]:
    """The vector extensions that decide CPU inference speed (a host without AVX-512 prefills
    several times slower), as /proc/cpuinfo lists them."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                have = set(line.split(":", 1)[1].split())
                return [f for f in _ISA if f in have]
    except OSError:
        pass
    return []


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1 << 20), 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def memcpy_gbps(rounds: int = 5, nbytes: int = _MEMCPY_BYTES) -> float:
    """Median GB/s of one large ``memmove`` on this machine (the memory-bandwidth reference)."""
    src, dst = bytearray(os.urandom(1 << 20)) * (nbytes >> 20), bytearray(nbytes)
    view = memoryview(dst)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        view[:] = src
        times.append(time.perf_counter() - t0)
    return round(nbytes / statistics.median(times) / 1e9, 2)


def loopback_gbps(rounds: int = 5, nbytes: int = _LOOPBACK_BYTES) -> float:
    """Median GB/s of one TCP stream over 127.0.0.1 (the network-path reference)."""
    times = []
    block = bytes(1 << 20)
    for _ in range(rounds):
        with socket.create_server(("127.0.0.1", 0)) as server:
            port = server.getsockname()[1]

            def send(port: int = port) -> None:
                with socket.create_connection(("127.0.0.1", port)) as s:
                    for _ in range(nbytes >> 20):
                        s.sendall(block)

            sender = threading.Thread(target=send, daemon=True)
            t0 = time.perf_counter()
            sender.start()
            conn, _ = server.accept()
            with conn:
                buf, got = bytearray(1 << 20), 0
                while got < nbytes:
                    n = conn.recv_into(buf)
                    if not n:
                        break
                    got += n
            times.append(time.perf_counter() - t0)
            sender.join()
    return round(nbytes / statistics.median(times) / 1e9, 2)


def machine_facts(references: bool = True) -> dict[str, Any]:
    """CPU model, cores (all and this process's), memory, Python, and the two references."""
    facts: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "cpu_flags": _cpu_flags(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": _memory_gib(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        # Other work on the cores while the figures were taken (1-minute load average).
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    if references:
        facts["memcpy_gbps"] = memcpy_gbps()
        facts["loopback_gbps"] = loopback_gbps()
    return facts


def command_line(bench: str, argv: list[str], prog: list[str] | None = None) -> str:
    return shlex.join([*(prog or ["kvstack", "bench", bench]), *argv])


def save(
    bench: str,
    argv: list[str],
    result: dict[str, Any],
    path: str | Path | None = None,
    *,
    started: float | None = None,
    quiet: bool = False,
    prog: list[str] | None = None,
    flat: bool = False,
) -> Path:
    """Write ``result`` with its command line, commit and machine; return where it went.

    ``prog`` is the command before ``argv`` when it is not ``kvstack bench <bench>`` (the demo
    is ``kvstack demo``). ``flat`` puts the figures beside the envelope's fields instead of under
    ``result`` (the demo's ``demo.json`` keeps the keys its users read: ``story``, ``load``).
    """
    commit, dirty = git_commit()
    now = time.gmtime()
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "bench": bench,
        "command": command_line(bench, argv, prog),
        "commit": commit,
        "dirty": dirty,
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", now),
        "seconds": round(time.time() - started, 1) if started is not None else None,
        "machine": machine_facts(),
    }
    if flat:
        clash = ENVELOPE & result.keys()
        if clash:
            raise ValueError(f"result keys clash with the envelope's: {sorted(clash)}")
        document |= result
    else:
        document["result"] = result
    if path is None:
        path = DEFAULT_DIR / bench / f"{bench}-{time.strftime('%Y%m%dT%H%M%SZ', now)}.json"
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1, default=_jsonable) + "\n")
    if not quiet:
        print(f"result written to {out}", file=sys.stderr)
    return out


def _jsonable(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "__dict__"):
        return vars(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def load(path: Path) -> Result:
    """Read one result document; a document without the envelope's fields is an error."""
    data = json.loads(path.read_text())
    if "result" not in data and "bench" in data:  # a flat document (save(flat=True))
        data["result"] = {k: v for k, v in data.items() if k not in ENVELOPE}
    missing = [k for k in ("bench", "command", "commit", "measured", "result") if k not in data]
    if missing:
        raise ValueError(f"{path}: not a kvstack bench result (missing {', '.join(missing)})")
    return Result(
        path=path,
        bench=data["bench"],
        command=data["command"],
        commit=data["commit"],
        measured=data["measured"],
        machine=data.get("machine") or {},
        result=data["result"],
        stale=data.get("stale"),
        provenance=data.get("provenance", "measured"),
    )


def newest(directory: Path, bench: str, variant: str | None = None) -> Result | None:
    """The newest committed result of ``bench`` (by measured time), or None.

    ``variant`` picks files named ``<bench>-<variant>-*.json`` (for example one compare config);
    without it, only the plain ``<bench>-<day>.json`` files count.
    """
    folder = directory / bench
    if not folder.is_dir():
        return None
    prefix = f"{bench}-{variant}-" if variant else f"{bench}-"
    paths = sorted(folder.glob(f"{prefix}*.json"))
    if variant is None:  # the plain files only: <bench>-<day or stamp>.json, <bench>-quick.json
        paths = [p for p in paths if p.name[len(prefix) :][:1].isdigit()
                 or p.name[len(prefix) :].startswith("quick")]  # fmt: skip
    found = [load(p) for p in paths]
    return max(found, key=lambda r: r.measured, default=None)
