"""Where the connector's block copies run: on the step, on a background thread, or on a GPU
side stream.

A :class:`CopyStream` runs copy work in submission order and returns a :class:`Completion`:

- :class:`InlineStream` runs it at once, on the caller's thread (the copy is part of the step);
- :class:`ThreadStream` runs it on one background thread, off the cores the engine computes on
  (vLLM's CPU build; :mod:`kvstack.kv.affinity`), so it overlaps the next layers or steps;
- :class:`CUDAStream` enqueues it on a side stream (the work's kernels and copies are
  asynchronous) after the compute stream's work so far; its completion is a CUDA event.

``Completion.before_compute()`` orders the engine's next compute after the copy: a host wait
for the first two, a stream-to-event dependency (no host wait) on a GPU. Layer pipelining and
asynchronous copy-out are written once against this interface, so the same code runs on the CPU
build (and in tests, on CPU tensors) and on GPUs.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Protocol

import torch

from kvstack.kv.affinity import enter_background

__all__ = [
    "DONE",
    "CUDAStream",
    "Completion",
    "CopyStream",
    "InlineStream",
    "ThreadStream",
    "make_stream",
]


class Completion(Protocol):
    def done(self) -> bool:
        """Whether the work has finished (never blocks)."""

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block the host until the work has finished; False on timeout."""

    def before_compute(self) -> None:
        """Make the engine's next compute run after the work (waits on the host where the
        compute is host-ordered)."""


class CopyStream(Protocol):
    def submit(self, work: Callable[[], None]) -> Completion:
        """Run ``work`` after everything submitted before (raises what ``work`` raised, for
        inline streams; later streams report it through :meth:`Completion.wait`)."""

    def close(self) -> None: ...


class _Done:
    def done(self) -> bool:
        return True

    def wait(self, timeout_s: float | None = None) -> bool:
        return True

    def before_compute(self) -> None:
        return


DONE: Completion = _Done()


class InlineStream:
    def submit(self, work: Callable[[], None]) -> Completion:
        work()
        return DONE

    def close(self) -> None:
        return


class _FutureCompletion:
    def __init__(self, future: concurrent.futures.Future[None]) -> None:
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout_s: float | None = None) -> bool:
        try:
            self._future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            return False
        return True

    def before_compute(self) -> None:
        self.wait()


class ThreadStream:
    """One background thread, started on the background CPUs of vLLM's CPU build."""

    def __init__(self, name: str) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=name, initializer=enter_background
        )
        self._lock = threading.Lock()

    def submit(self, work: Callable[[], None]) -> Completion:
        # Inference mode is per thread: vLLM steps in it and its KV cache and the connector's
        # staging tensors are inference tensors, which only code in inference mode may write.
        # The work runs in the mode of the thread that submitted it.
        inference = torch.is_inference_mode_enabled()

        def run() -> None:
            with torch.inference_mode(inference):
                work()

        with self._lock:
            return _FutureCompletion(self._pool.submit(run))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class _EventCompletion:
    def __init__(self, event: torch.cuda.Event) -> None:
        self._event = event

    def done(self) -> bool:
        return bool(self._event.query())  # type: ignore[no-untyped-call]

    def wait(self, timeout_s: float | None = None) -> bool:
        self._event.synchronize()
        return True

    def before_compute(self) -> None:
        torch.cuda.current_stream().wait_event(self._event)


class CUDAStream:
    """A side stream: work is enqueued asynchronously; ``follow_compute`` orders it after the
    compute stream's work so far (copy-outs must see the step's KV; loads into blocks no
    kernel touches need not wait for the forward pass)."""

    def __init__(self, device: torch.device, follow_compute: bool = True) -> None:
        self._device = device
        self._stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
        self._follow = follow_compute

    def submit(self, work: Callable[[], None]) -> Completion:
        torch.cuda.set_device(self._device)  # load threads start without a current device
        if self._follow:
            self._stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._stream):
            work()
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self._stream)
        return _EventCompletion(event)

    def close(self) -> None:
        self._stream.synchronize()


def make_stream(
    device: torch.device, background: bool, name: str, follow_compute: bool = True
) -> CopyStream:
    """A side stream on GPUs; on CPUs a background thread or the caller's thread."""
    if device.type == "cuda":
        return CUDAStream(device, follow_compute)
    return ThreadStream(name) if background else InlineStream()
