"""``kvstack bench all --quick``: its plan covers every published benchmark."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstack.bench import all as bench_all
from kvstack.bench import cli, report


def test_the_plan_runs_every_benchmark_that_has_a_published_region() -> None:
    planned = {s.bench for s in bench_all.QUICK}
    published = {name.split("-")[0] for name in report.REGIONS} - {"readme", "commands"}
    published -= report.OWN_FORMAT  # the GPU check runs on a device, not in bench all
    assert published <= planned, f"no quick run for {sorted(published - planned)}"
    assert planned <= set(cli.BENCHMARKS) | {"demo"}


def test_list_prints_each_command_with_its_result_path(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:  # fmt: skip
    assert bench_all.run(["--quick", "--list", "--only", "kv,radix", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"kvstack bench kv --quick --json {tmp_path}/kv/kv-quick.json",
        f"kvstack bench radix --rounds 3 --json {tmp_path}/radix/radix-quick.json",
    ]


def test_an_unknown_benchmark_is_refused() -> None:
    with pytest.raises(SystemExit):
        bench_all.run(["--quick", "--only", "kvv"])
