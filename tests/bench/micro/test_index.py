"""``kvstack bench index`` on a small index: both backends are measured in one run (real index
server, real redis-server), every answer is checked, and the result file holds the figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstack.bench.micro import index

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_both_backends_in_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "index.json"
    argv = ["--entries", "20000", "--lookups", "10", "--rounds", "2", "--no-cluster", "--json",
            str(out)]  # fmt: skip
    assert index.run(argv) == 0
    document = json.loads(out.read_text())
    assert document["bench"] == "index" and document["command"].startswith("kvstack bench index")
    result = document["result"]
    arms = result["lookup_128k"]
    assert {"in_process", "service_zmq", "service_http", "valkey", "service_http_json"} == set(arms)
    assert arms["valkey"]["n"] == 10 and arms["valkey"]["server_cpu_ms"] is not None
    for backend in ("service", "valkey"):
        figures = result["announce"][backend]
        assert figures["bulk_events_per_s"] > 0 and figures["steady_events_per_s"] > 0
    assert set(result["verdict"]) == {"valkey_p99_over_zmq_p99", "valkey_p99_le_zmq_p99",
                                      "valkey_p99_le_5ms"}  # fmt: skip
    assert "valkey" in capsys.readouterr().out
