"""Keep kvstack's background threads off the cores an engine computes on.

vLLM's CPU build binds its worker's main thread and OpenMP threads to the cores it computes on,
and leaves the others to the scheduler and API server processes. A thread started from the
bound thread inherits the binding, so kvstack's disk, network and checksum threads would take
time slices from the model on the same core (vLLM's NIXL connector avoids this by moving its
transfer thread to a reserved core). The worker calls :func:`reserve_background_cpus` once,
on the CPU build; threads started inside :func:`starting_background_threads`, and pool threads
that run :func:`enter_background` first, then run on the cores the worker is not bound to, or
on those ``KVSTACK_BACKGROUND_CPUS`` lists (``kvstack up`` sets it to its reserved cores, or
to all of its cores when none is reserved).
Elsewhere (GPU engines, tests, tools) nothing changes: there are no background cores.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "background_cpus",
    "enter_background",
    "reserve_background_cpus",
    "starting_background_threads",
]

log = logging.getLogger(__name__)
BACKGROUND_ENV = "KVSTACK_BACKGROUND_CPUS"  # e.g. "14-15": where to run instead (kvstack up)
_background: frozenset[int] | None = None


def _machine_cpus() -> set[int]:
    """The CPUs this process may use at all (its cgroup's cpuset, else every online CPU)."""
    for path in ("/sys/fs/cgroup/cpuset.cpus.effective", "/sys/fs/cgroup/cpuset/cpuset.cpus"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text:
            return _parse_cpu_list(text)
    return set(range(os.cpu_count() or 1))


def _parse_cpu_list(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def _configured_cpus(text: str, default: frozenset[int]) -> frozenset[int]:
    try:
        return frozenset(_parse_cpu_list(text)) & frozenset(_machine_cpus())
    except ValueError:
        log.warning("%s=%r is not a CPU list (like 2-3,6); ignored", BACKGROUND_ENV, text)
        return default


def reserve_background_cpus() -> frozenset[int] | None:
    """Background threads go to the CPUs the calling (bound) thread does not use; None when
    it uses them all (nothing to move to) or the platform has no affinity calls."""
    global _background
    if not hasattr(os, "sched_getaffinity"):
        return None
    bound = os.sched_getaffinity(0)
    spare = frozenset(_machine_cpus() - bound)
    if os.environ.get(BACKGROUND_ENV):  # the cores `kvstack up` reserved for them
        spare = _configured_cpus(os.environ[BACKGROUND_ENV], spare)
    _background = spare or None
    if _background:
        log.info("kvstack background threads on CPUs %s (the engine computes on %s)",
                 sorted(_background), sorted(bound))  # fmt: skip
    return _background


def background_cpus() -> frozenset[int] | None:
    return _background


def enter_background() -> None:
    """Move the calling thread to the background CPUs (a thread pool's ``initializer``)."""
    if _background:
        try:
            os.sched_setaffinity(0, _background)
        except OSError as exc:  # CPUs went offline or the cgroup changed: stay where we are
            log.debug("cannot move a background thread to %s: %s", sorted(_background), exc)


@contextmanager
def starting_background_threads() -> Iterator[None]:
    """Threads started inside inherit the background CPUs (the caller's binding comes back)."""
    if not _background:
        yield
        return
    before = os.sched_getaffinity(0)
    enter_background()
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
