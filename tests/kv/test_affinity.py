"""Background threads leave the cores the engine's worker thread is bound to."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from kvstack.kv.affinity import _parse_cpu_list

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs CPU affinity calls and two usable CPUs",
)


def test_cpu_lists_parse() -> None:
    assert _parse_cpu_list("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}


def test_threads_started_for_the_cache_run_off_the_bound_core() -> None:
    # In a child process: binding the test runner's own main thread would outlive the test.
    script = textwrap.dedent(
        """
        import os, threading
        from concurrent.futures import ThreadPoolExecutor
        from kvstack.kv import affinity

        usable = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {usable[0]})            # what vLLM does to its worker thread
        spare = affinity.reserve_background_cpus()
        assert spare is not None and usable[0] not in spare, spare
        seen = {}
        def record(name):
            seen[name] = os.sched_getaffinity(0)
        with affinity.starting_background_threads():
            t = threading.Thread(target=record, args=("thread",)); t.start()
        t.join()
        pool = ThreadPoolExecutor(1, "p", affinity.enter_background)
        pool.submit(record, "pool").result()
        record("main")
        assert seen["thread"] == spare and seen["pool"] == spare, seen
        assert seen["main"] == {usable[0]}, seen      # the caller keeps its binding
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_nothing_moves_when_the_thread_uses_every_cpu() -> None:
    script = textwrap.dedent(
        """
        from kvstack.kv import affinity
        assert affinity.reserve_background_cpus() is None
        with affinity.starting_background_threads():
            pass
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_kvstack_up_can_name_the_background_cpus() -> None:
    # `kvstack up` reserves cores and says so in KVSTACK_BACKGROUND_CPUS; a bad value is ignored.
    script = textwrap.dedent(
        """
        import os
        from kvstack.kv import affinity

        usable = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {usable[0]})
        os.environ["KVSTACK_BACKGROUND_CPUS"] = str(usable[0])  # not the default (the others)
        assert affinity.reserve_background_cpus() == {usable[0]}
        os.environ["KVSTACK_BACKGROUND_CPUS"] = "two"
        assert affinity.reserve_background_cpus() == set(usable) - {usable[0]}
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
