"""The GPU check on CPU: vLLM's layouts as modelled, byte-identical round trips (and a corrupted
one caught), and ``benchmarks/gpu/check.py --device cpu`` writing its self-describing result."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from kvstack.bench.micro import gpu_measure as m
from kvstack.bench.micro.gpu_check import plan_for
from kvstack.bench.micro.gpu_report import failures
from kvstack.bench.micro.kv_device import measure_device_tiers
from kvstack.bench.micro.kv_measure import Shape
from kvstack.bench.micro.paged_layouts import LAYOUTS, PagedShape, build_paged
from kvstack.integrations.vllm.streams import InlineStream
from kvstack.kv.cache import KVCache
from kvstack.kv.config import KVConfig

ROOT = Path(__file__).resolve().parents[3]
SHAPE = PagedShape("tiny", 3, 2, 8, 4, torch.bfloat16)
CPU = torch.device("cpu")


def transfer(layout: str, dtype: torch.dtype = torch.bfloat16) -> m.PagedTransfer:
    alloc = build_paged(SHAPE._replace(dtype=dtype), layout, 20, CPU, seed=1)
    return m.PagedTransfer.plan(alloc, num_chunks=3, blocks_per_chunk=2)


def cache(tier: str, tmp_path: Path) -> KVCache:
    url = {"cpu": "cpu://?size=4MiB", "file": f"file://{tmp_path}?size=16MiB"}[tier]
    return KVCache(KVConfig(model="test", chunk_size=8, tiers=[url]))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pages_are_the_attention_backends_blocks(layout: str) -> None:
    """PagedKV's page of (layer, block) is the bytes of that layer's block in the backend's
    own view: the layout is modelled as vLLM places it, not just self-consistently."""
    alloc = build_paged(SHAPE, layout, 6, CPU, seed=2)
    for layer, name in enumerate(alloc.paged.layout.layer_names):
        view = alloc.kv_caches[name]
        assert view.shape == (6, SHAPE.num_kv_heads, SHAPE.block_size, 2 * SHAPE.head_dim)
        for block in range(6):
            expected = view[block].contiguous().view(torch.uint8).reshape(-1)
            assert torch.equal(alloc.paged.pages[layer][block], expected), (layer, block)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_copy_out_and_load_move_every_byte(layout: str, dtype: torch.dtype) -> None:
    t = transfer(layout, dtype)
    m.clear_blocks(t.paged, t.dst_chunks)
    assert not m.pages_equal(t.paged, t.src_chunks, t.dst_chunks)
    m.connector_d2h(t, InlineStream())
    m.connector_h2d(t, InlineStream())
    assert m.pages_equal(t.paged, t.src_chunks, t.dst_chunks)
    t.staging[1][2, 0, 5] ^= 1  # one bit of one layer of one staged chunk
    m.connector_h2d(t, InlineStream())
    assert not m.pages_equal(t.paged, t.src_chunks, t.dst_chunks)


@pytest.mark.parametrize("tier", ["cpu", "file"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_trips_are_byte_identical(layout: str, tier: str, tmp_path: Path) -> None:
    t = transfer(layout)
    with cache(tier, tmp_path) as kv:
        trip = m.round_trip(t, kv, "a")
    assert trip.byte_identical and trip.stored_chunks == 3 and trip.loaded_blocks == 6


def test_a_corrupted_buffer_fails_the_round_trip(tmp_path: Path) -> None:
    t = transfer("cross-layer")
    with cache("cpu", tmp_path) as kv:
        load = kv.get_chunks_into

        def corrupting(keys: Any, outs: list[torch.Tensor]) -> int:
            loaded = load(keys, outs)
            outs[-1].view(-1)[7] ^= 0x80  # a corrupt byte in the last staged chunk
            return loaded

        kv.get_chunks_into = corrupting  # type: ignore[method-assign]
        trip = m.round_trip(t, kv, "b")
    assert trip.loaded_blocks == 6 and not trip.byte_identical
    result: dict[str, Any] = {
        "configs": [
            {
                "shape": "tiny",
                "dtype": "bf16",
                "layout": "cross-layer",
                "copy_byte_identical": True,
                "round_trips": {"cpu": {"byte_identical": trip.byte_identical}},
            },
        ],
        "kv_bench": {"byte_identical": True},
    }
    assert failures(result) == ["tiny bf16 cross-layer cpu round trip"]


def test_bench_kv_device_path_on_cpu_tensors(tmp_path: Path) -> None:
    shape = Shape("tiny", 2, 2, 16, 32, torch.bfloat16)
    report = measure_device_tiers(shape, 2, 1, CPU, tmp_path)
    assert report["byte_identical"] and report["rounds"] == 1
    for tier in ("cpu", "file"):
        figures = report["tiers"][tier]
        assert figures["store_gbps"]["median"] > 0 and figures["retrieve_ratio"] > 0


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gpu_check_script", ROOT / "benchmarks/gpu/check.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_check_on_cpu_writes_its_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "check.json"
    args = ["--device", "cpu", "--json", str(out), "--dir", str(tmp_path), "--commit", "abc"]
    assert load_script().main(args) == 0
    result = json.loads(out.read_text())
    meta = result["meta"]
    # the command names no folder of the machine it ran on
    assert meta["command"] == (
        "python benchmarks/gpu/check.py --device cpu --json check.json --dir <dir> --commit abc"
    )
    assert meta["env"] == {} or "KVSTACK_PAGED_KERNELS" in meta["env"]
    assert meta["git_commit"] == "abc" and meta["torch"] == torch.__version__
    assert {"cuda", "device_name", "python", "elapsed_s"} <= set(meta)
    assert result["byte_identical"] and result["byte_mismatches"] == []
    plan = plan_for("cpu", small=True)
    assert len(result["configs"]) == len(plan.shapes) * 2 * len(LAYOUTS)
    for config in result["configs"]:
        for way in ("d2h", "h2d"):
            assert config[way]["connector_gbps"]["median"] > 0 and config[way]["ratio"]["min"] > 0
        for trip in config["round_trips"].values():
            assert trip["byte_identical"] and trip["stored_chunks"] == [trip["expected_chunks"]]
        assert len(config["overlap"]["with_transfer_ms"]["samples"]) == plan.overlap_rounds
    assert {t["target"] for t in result["targets"]} == {">= 0.8x", "<= 10%"}
    assert result["link_peak"]["d2h_gbps"]["median"] > 0 and result["kv_bench"]["byte_identical"]
    table = capsys.readouterr().out
    assert "connector GB/s" in table and "byte-identical: every round trip" in table
    assert not list(tmp_path.glob("kvstack-*")), "the check left files behind"


def test_the_check_names_missing_wheels(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_script()
    monkeypatch.setitem(script.NEEDED, "kvstack_no_such_module", "no-such-wheel")
    assert script.main(["--device", "cpu"]) == 3
    err = capsys.readouterr().err
    assert "missing no-such-wheel for Python" in err and "pip download" in err


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message on a machine without CUDA"
)
def test_bench_kv_device_cuda_without_cuda_says_so() -> None:
    from kvstack.bench.micro import kv

    with pytest.raises(SystemExit, match="torch sees no CUDA device"):
        kv.run(["--device", "cuda"])
