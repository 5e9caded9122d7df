"""Do the connector's transfers overlap compute? A matmul timed alone and next to them.

The matmul runs on the default (compute) stream. The transfer is the connector's copy-out and
load (:func:`~kvstack.bench.micro.gpu_measure.copy_out_work`, then
:func:`~kvstack.bench.micro.gpu_measure.load_work`), repeated often enough to outlast the
matmuls, submitted first to the connector's own copy stream (``make_stream``: a CUDA side
stream; on CPUs a background thread). On a GPU the matmuls are timed with CUDA events, so the
host's time spent enqueueing the copies does not count; ``covered`` says whether the transfer
was still running when the last matmul ended (else the slowdown understates the contention).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvstack.bench.micro.gpu_measure import PagedTransfer, copy_out_work, load_work, sync
from kvstack.integrations.vllm.streams import Completion, CopyStream, make_stream
from kvstack.kv.tensors import torch

__all__ = ["Overlap", "measure_overlap"]

MAX_REPEATS = 400


@dataclass
class Overlap:
    matmul_n: int
    matmul_iters: int
    alone_s: list[float]
    with_transfer_s: list[float]
    transfer_repeats: int
    covered: list[bool]
    # the reference: PyTorch's pinned copy of the same bytes, out and back, on the same stream
    with_torch_s: list[float]
    torch_repeats: int
    torch_covered: list[bool]

    @property
    def slowdown(self) -> float:
        """Median matmul time with the transfer running over the median alone, minus one."""
        return statistics.median(self.with_transfer_s) / statistics.median(self.alone_s) - 1

    @property
    def torch_slowdown(self) -> float:
        """The same, with PyTorch's own copy of the bytes running instead."""
        return statistics.median(self.with_torch_s) / statistics.median(self.alone_s) - 1


def measure_overlap(
    t: PagedTransfer, transfer_s: float, n: int, iters: int, rounds: int
) -> Overlap:
    """``rounds`` of: the matmuls alone, then with the transfer running on the side stream
    (repeated to last twice the matmuls' time; ``transfer_s``: one copy-out and load)."""
    device = t.paged.device
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty_like(a)

    def matmuls() -> None:
        for _ in range(iters):
            torch.mm(a, a, out=out)

    matmuls()  # warm-up: kernels chosen, clocks up
    sizing = _matmul_seconds(device, matmuls)
    repeats = min(MAX_REPEATS, math.ceil(2 * sizing / transfer_s) + 2)
    copy_out, load = copy_out_work(t), load_work(t)
    dev = torch.empty(t.num_bytes, dtype=torch.uint8, device=device)
    host = torch.empty(t.num_bytes, dtype=torch.uint8, pin_memory=device.type == "cuda")

    def torch_copies() -> None:
        host.copy_(dev, non_blocking=True)
        dev.copy_(host, non_blocking=True)

    started = threading.Event()

    def repeated(work: list[Callable[[], None]], times: int) -> Callable[[], None]:
        def transfer() -> None:
            for _ in range(times):
                for step in work:
                    step()
                started.set()

        return transfer

    # Loads follow no compute (as the connector's); enqueued from their own thread, as the
    # connector's load threads do, so the matmuls are enqueued while the copies still are.
    stream = make_stream(device, True, "kvstack-overlap", follow_compute=False)
    torch_s = _transfer_seconds(device, stream, torch_copies)
    torch_repeats = min(MAX_REPEATS, math.ceil(2 * sizing / torch_s) + 2)
    connector = repeated([copy_out, load], repeats)
    reference = repeated([torch_copies], torch_repeats)
    result = Overlap(n, iters, [], [], repeats, [], [], torch_repeats, [])
    try:
        for _ in range(rounds):  # alone and with each transfer in turn: drift hits all
            result.alone_s.append(_matmul_seconds(device, matmuls))
            took, covered = _next_to(device, connector, started, stream, matmuls)
            result.with_transfer_s.append(took)
            result.covered.append(covered)
            took, covered = _next_to(device, reference, started, stream, matmuls)
            result.with_torch_s.append(took)
            result.torch_covered.append(covered)
    finally:
        stream.close()
    return result


def _transfer_seconds(device: torch.device, stream: CopyStream, work: Callable[[], None]) -> float:
    stream.submit(work).wait()  # warm-up
    sync(device)
    start = time.perf_counter()
    stream.submit(work).wait()
    sync(device)
    return max(time.perf_counter() - start, 1e-6)


def _next_to(
    device: torch.device,
    transfer: Callable[[], None],
    started: threading.Event,
    stream: CopyStream,
    matmuls: Callable[[], None],
) -> tuple[float, bool]:
    """The matmuls' seconds with ``transfer`` running, and whether it still ran at their end."""
    sync(device)
    started.clear()
    submitted: list[Completion] = []
    submitter = threading.Thread(target=lambda: submitted.append(stream.submit(transfer)))
    submitter.start()
    started.wait(60)
    seconds = _matmul_seconds(device, matmuls, synced=False)
    covered = submitter.is_alive() or not (submitted and submitted[0].done())
    submitter.join()
    submitted[0].wait()
    return seconds, covered


def _matmul_seconds(device: torch.device, work: Callable[[], None], synced: bool = True) -> float:
    if device.type != "cuda":
        start = time.perf_counter()
        work()
        return time.perf_counter() - start
    if synced:
        sync(device)
    begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    begin.record()
    work()
    end.record()
    end.synchronize()
    return float(begin.elapsed_time(end)) / 1e3
