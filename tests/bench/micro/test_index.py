"""``kvstack bench index`` on a small index: both backends are measured in one run (real index
server, real redis-server), every answer is checked, and the result file holds the figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstack.bench.micro import index, index_report, index_routers

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_both_backends_in_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "index.json"
    argv = ["--entries", "20000", "--lookups", "10", "--rounds", "2", "--no-cluster",
            "--routers", "", "--json", str(out)]  # fmt: skip
    assert index.run(argv) == 0
    document = json.loads(out.read_text())
    assert document["bench"] == "index" and document["command"].startswith("kvstack bench index")
    result = document["result"]
    arms = result["lookup_128k"]
    assert {"in_process", "service_zmq", "service_http", "valkey", "valkey_one_trip",
            "service_http_json"} == set(arms)  # fmt: skip
    assert arms["valkey"]["n"] == 10 and arms["valkey"]["server_cpu_ms"] is not None
    for backend in ("service", "valkey"):
        figures = result["announce"][backend]
        assert figures["bulk_events_per_s"] > 0 and figures["steady_events_per_s"] > 0
    assert set(result["verdict"]) == {"valkey_p99_over_zmq_p99", "valkey_p99_le_zmq_p99",
                                      "valkey_p99_le_5ms"}  # fmt: skip
    assert "valkey" in capsys.readouterr().out


def test_several_routers_ask_at_once(tmp_path: Path) -> None:
    """Two router processes ask every backend at once; each answer is checked in the router
    process (a wrong answer fails the run), and the figures count both routers' lookups."""
    out = tmp_path / "index.json"
    argv = ["--entries", "5000", "--lookups", "4", "--rounds", "2", "--no-cluster",
            "--routers", "2", "--json", str(out)]  # fmt: skip
    assert index.run(argv) == 0
    result = json.loads(out.read_text())["result"]
    fleet = result["routers"]["2"]
    assert set(fleet) == {"service_zmq", "valkey"}
    for figures in fleet.values():
        assert figures["n"] == 2 * 4 and figures["lookups_per_s"] > 0
        assert 0 < figures["p50_ms"] <= figures["p99_ms"]
        # Paced: every backend at the same offered load, a share of the slowest's rate; each
        # router asks lookups // routers times, a round's worth per round.
        assert (
            figures["paced_n"] == 2 * 2 and 0 < figures["paced_p50_ms"] <= figures["paced_p99_ms"]
        )
    offered = {f["paced_per_s"] for f in fleet.values()}
    slowest = min(f["lookups_per_s"] for f in fleet.values())
    assert len(offered) == 1 and offered.pop() == pytest.approx(index_routers.PACED_SHARE * slowest)
    assert "routers_2_valkey_p99_over_zmq_p99" in result["verdict"]
    assert "routers_2_paced_valkey_p99_over_zmq_p99" in result["verdict"]
    published = tmp_path / "results" / "index"
    published.mkdir(parents=True)
    (published / "index-2026-01-01.json").write_text(out.read_text())
    table = index_report.render(tmp_path / "results")
    assert "| 2 | Valkey |" in table and "p99 / ZMQ's" in table
    assert "paced p99 / ZMQ's" in table and "70% of the slowest backend's" in table
    assert "p99 ≤ ZMQ's: " in table and "(rounds: " in table  # each round's ratio, too


def test_paced_arrivals_offer_the_asked_load_interleaved_and_alike_for_every_backend() -> None:
    """Poisson arrivals: all routers together near the asked rate, each router's first arrival
    offset so that they do not start in step, and the same times for the same seed (every
    backend in a round is asked on the same schedule)."""
    arrivals = index_routers._arrivals(4, 2000, per_s=400.0, seed=3)
    assert arrivals == index_routers._arrivals(4, 2000, per_s=400.0, seed=3)
    assert arrivals != index_routers._arrivals(4, 2000, per_s=400.0, seed=4)
    assert [times[0] for times in arrivals] == pytest.approx([0.0, 0.0025, 0.005, 0.0075])
    for times in arrivals:
        assert times == sorted(times)
        rate = (len(times) - 1) / (times[-1] - times[0])  # one router: 100/s
        assert 90 < rate < 110


def test_router_counts_are_checked() -> None:
    with pytest.raises(SystemExit):
        index.run(["--routers", "0"])


def test_a_router_that_cannot_ask_fails_the_run_with_its_reason() -> None:
    with pytest.raises(RuntimeError, match=r"did not start: .*127\.0\.0\.1:9"):
        index_routers.measure_routers({"valkey": "redis://127.0.0.1:9/0"}, [1], 2, 1)


def test_the_arms_take_turns_every_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Within a round the arms alternate every BLOCK lookups; each round has its own p99."""
    asked: list[str] = []
    monkeypatch.setattr(index, "check", lambda reply: None)
    arms = [index.Arm(name, lambda name=name: asked.append(name), [])  # type: ignore[misc]
            for name in ("a", "b")]  # fmt: skip
    index._interleave(arms, rounds=2, per_round=25)
    block = index.BLOCK
    one_round = ["a"] + ["b"] + ["a"] * block + ["b"] * block + ["a"] * block + ["b"] * block
    one_round += ["a"] * (25 - 2 * block) + ["b"] * (25 - 2 * block)  # the checks, then turns
    assert asked == one_round * 2
    assert [len(arm.wall_ms) for arm in arms] == [50, 50]
    assert [len(arm.round_p99_ms) for arm in arms] == [2, 2]
