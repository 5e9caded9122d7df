"""``kill -9`` during heavy writes, then restart: no corrupt data returned, index consistent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from kvstack.kv.keys import ChunkKey
from kvstack.kv.tiers.file import chunkfile
from kvstack.kv.tiers.file.tier import FileTier

NUM_BYTES = 1 << 20

_WRITER = f"""
import sys, time, torch
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tiers.file.tier import FileTier
root, fsync = sys.argv[1], sys.argv[2] == "1"
tier = FileTier(root, 1 << 40, fsync=fsync, queue_depth=4)
base = torch.arange({NUM_BYTES}, dtype=torch.int64)
i = 0
while True:
    chunk = ((base * (i + 1)) % 251).to(torch.uint8)
    if tier.put(ChunkKey(i.to_bytes(16, "little")), chunk):
        i += 1
    else:
        time.sleep(0.001)
"""


def expected(i: int) -> torch.Tensor:
    return ((torch.arange(NUM_BYTES, dtype=torch.int64) * (i + 1)) % 251).to(torch.uint8)


def test_kill_9_during_writes_then_restart(tmp_path: Path) -> None:
    # fsync off, the default: a killed process loses nothing the page cache holds, so fsync
    # would only matter for power loss, which a test cannot stage.
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), "0"])
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("??/*.kvc"))) < 24 and time.monotonic() < deadline:
            assert child.poll() is None, "the writer died on its own"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)  # mid-stream: the writer is always busy
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL

    tier = FileTier(tmp_path, 1 << 40)
    tier.check_integrity()  # index == files on disk, sizes add up
    assert not list((tmp_path / chunkfile.TMP_DIR).iterdir()), "the dead writer's temp files stay"
    num = tier.stats().entries
    assert num >= 24
    for i in range(num + 8):  # every chunk is either complete and right, or a miss
        got = tier.get(ChunkKey(i.to_bytes(16, "little")))
        assert got is None or torch.equal(got, expected(i)), f"chunk {i} is wrong"
    assert tier.stats().corrupt == 0
    tier.close()
