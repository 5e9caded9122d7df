"""Block hashes match vLLM's sha256_cbor hashing, by its own function and by captured events."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import cbor2
import pytest

from kvstack.sim.hashing import (
    block_extra_keys,
    cbor,
    chain_block_hashes,
    external_hash,
    none_hash,
)

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize(
    "value",
    [0, 23, 24, 255, 256, 65535, 65536, 2**32, 2**40, -1, -500, "", "lora", "é" * 30,
     b"\x00" * 32, None, True, (1, (2, "x")), [], tuple(range(300))],
)  # fmt: skip
def test_cbor_matches_cbor2_canonical(value: object) -> None:
    assert cbor(value) == cbor2.dumps(value, canonical=True)


# sha256 over each chain's block hashes, as the hand-written CBOR encoder computed them before
# cbor2 replaced it: ids of every CBOR head width (up to 2**33), LoRA, salt and both together.
GOLDEN_CHAINS = {
    (None, None): "78a016a1da8c1089fd234ca48e0d9109182cfabbd95f8a7453bf6bf9de278b43",
    (("a1", "/adapters/a1"), None): (
        "8f0fb00348c7143999b966018edaca55bf522403ae79fa6c34d54ea210a2f326"
    ),
    (None, "t1"): "ee228c6aa901f613db3952d4cfc430a4abcbda21ed3c282d5497ea1c1e063a9a",
    (("a", "/p"), "s"): "0494277deaf0e8d1f39ace0dbf7296e9eb9a66f193a1dbefaf34ef4eece2ea70",
}


@pytest.mark.parametrize(("lora", "salt"), list(GOLDEN_CHAINS))
def test_chains_are_bit_identical_to_the_earlier_encoder(
    lora: tuple[str, str] | None, salt: str | None
) -> None:
    rng = random.Random(14)
    tokens = [rng.randrange(0, 200_000) for _ in range(16 * 4 + 3)]
    tokens[3] = 2**33
    tokens[17:24] = [0, 23, 24, 255, 256, 65535, 65536]
    root = none_hash("vllm-none-hash")
    assert root.hex() == "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
    hashes = chain_block_hashes(tokens, 16, root, lora=lora, cache_salt=salt)
    assert len(hashes) == 4
    assert hashlib.sha256(b"".join(hashes)).hexdigest() == GOLDEN_CHAINS[(lora, salt)]


@pytest.mark.parametrize(
    ("lora", "salt"),
    [(None, None), (("a1", "/adapters/a1"), None), (None, "t1"), (("a", "/p"), "s")],
)
def test_chain_matches_vllm_hash_block_tokens(
    lora: tuple[str, str] | None, salt: str | None
) -> None:
    pytest.importorskip("vllm")
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_utils import hash_block_tokens

    rng = random.Random(0)
    tokens = [rng.randrange(0, 150_000) for _ in range(16 * 9 + 5)]
    root = none_hash("vllm-none-hash")
    ours = chain_block_hashes(tokens, 16, root, lora=lora, cache_salt=salt)
    parent = root
    theirs = []
    for i in range(len(tokens) // 16):
        extra = block_extra_keys(lora, salt, i == 0)
        parent = hash_block_tokens(sha256_cbor, parent, tokens[i * 16 : (i + 1) * 16], extra)
        theirs.append(parent)
    assert ours == theirs
    # Continuing a chain from its middle gives the same tail.
    assert chain_block_hashes(tokens, 16, ours[3], 4, lora, salt) == ours[4:]


def test_hashes_equal_those_of_a_real_vllm_engine() -> None:
    fixture = json.loads((DATA / "vllm_kv_events.json").read_text())
    root = none_hash("vllm-none-hash")
    checked = 0
    for frame in fixture["frames"]:
        for event in frame["batch"][1]:
            if event["type"] != "BlockStored":
                continue
            lora = (event["lora_name"], fixture["lora_path"]) if event["lora_name"] else None
            hashes = chain_block_hashes(event["token_ids"], event["block_size"], root, lora=lora)
            assert [external_hash(h) for h in hashes] == event["block_hashes"]
            checked += 1
    assert checked == 4
