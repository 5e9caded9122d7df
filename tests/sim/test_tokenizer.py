from __future__ import annotations

import pytest

from kvstack.sim.tokenizer import NUM_SPECIAL, ChatError, SimTokenizer


def test_one_word_is_one_token_and_tN_names_ids() -> None:
    tok = SimTokenizer(1000)
    ids = tok.encode("t20 t999 hello  world\nhello")
    assert len(ids) == 5
    assert ids[:2] == [20, 999]
    assert ids[2] == ids[4] and NUM_SPECIAL <= ids[2] < 1000
    assert tok.encode(tok.decode([17, 18, 500])) == [17, 18, 500]


def test_words_map_identically_in_every_instance() -> None:
    assert SimTokenizer(32000).encode("alpha beta") == SimTokenizer(32000).encode("alpha beta")


def test_out_of_range_tN_is_an_ordinary_word() -> None:
    tok = SimTokenizer(100)
    (token,) = tok.encode("t100")
    assert NUM_SPECIAL <= token < 100


def test_chat_template_wraps_messages() -> None:
    tok = SimTokenizer(1000)
    tokens = tok.apply_chat_template(
        [
            {"role": "system", "content": "t20"},
            {"role": "user", "content": [{"type": "text", "text": "t21 t22"}]},
        ]
    )
    assert tokens == [3, 20, 6, 4, 21, 22, 6, 5]
    # Any role renders, as vLLM's templates render it (recorded: a "wizard" is served); an
    # unknown role is a word of its own, not a known role's token.
    robot = tok.apply_chat_template([{"role": "robot", "content": "t20"}], False)
    assert robot[1:] == [20, 6] and robot[0] not in (3, 4, 5, 6)
    assert robot == tok.apply_chat_template([{"role": "robot", "content": "t20"}], False)
    with pytest.raises(ChatError, match="role must be a string"):
        tok.apply_chat_template([{"role": 5, "content": "x"}])


def test_token_ids_are_validated() -> None:
    tok = SimTokenizer(100)
    assert tok.check_ids([1, 2, 99]) == [1, 2, 99]
    with pytest.raises(ValueError, match="out of vocabulary"):
        tok.check_ids([100])
    with pytest.raises(ValueError, match="not an integer"):
        tok.check_ids(["x"])
