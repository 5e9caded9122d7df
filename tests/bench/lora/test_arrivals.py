"""The benchmark's adapters and arrivals are pinned: the same seed gives the same stream as when
the published figures were measured (a change here changes every figure of ``bench lora``)."""

from __future__ import annotations

import hashlib

import pytest

from kvstack.bench.workloads.lora_zipf import make_adapters, make_arrivals

# Digests of the stream the benchmark had before the workload moved into the registry.
PINNED = {
    (1000, 1.0, 20_000, 12.0, 0.7): "c7509a0eb822d65d",
    (60, 1.2, 500, 8.0, 0.5): "0620230878298c3e",
}


def _digest(
    num_adapters: int, zipf_s: float, num_requests: int, rate: float, interactive: float
) -> str:
    adapters = make_adapters(num_adapters, zipf_s)
    arrivals = make_arrivals(adapters, num_requests, rate, interactive)
    h = hashlib.sha256()
    for a in adapters:
        h.update(f"{a.adapter_id} {a.tier} {a.rank} {a.weight:.12e}\n".encode())
    for x in arrivals:
        h.update(f"{x.t_s:.6f} {x.adapter} {x.interactive} {x.user}\n".encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize(("params", "expected"), PINNED.items())
def test_the_stream_is_the_one_the_figures_were_measured_on(
    params: tuple[int, float, int, float, float], expected: str
) -> None:
    assert _digest(*params) == expected


def test_tiers_hold_their_share_of_adapters_and_traffic() -> None:
    adapters = make_adapters(1000, 1.0)
    count = {t: sum(1 for a in adapters if a.tier == t) for t in ("platinum", "gold", "standard")}
    assert count == {"platinum": 20, "gold": 180, "standard": 800}
    share = {t: sum(a.weight for a in adapters if a.tier == t) for t in count}
    assert share == pytest.approx({"platinum": 0.3, "gold": 0.4, "standard": 0.3})
    platinum = [a for a in adapters if a.tier == "platinum"]
    assert platinum[0].adapter_id == "platinum-0000" and platinum[0].weight > platinum[1].weight
