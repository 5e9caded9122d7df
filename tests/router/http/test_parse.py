"""Request parsing: the fields routing needs, checked as OpenAI does."""

from __future__ import annotations

import pytest

from kvstack.errors import RequestError
from kvstack.router.http.parse import parse_request


def test_request_parsing() -> None:
    headers = {"x-session-id": "s", "x-kvstack-priority": "critical"}
    r = parse_request("completions", b'{"model":"m","prompt":[1,2,3],"max_tokens":4}', headers)
    assert r.token_ids == [1, 2, 3] and r.estimated_prompt_tokens == 3
    assert (r.session_id, r.priority, r.max_tokens) == ("s", "critical", 4)
    content = b'[{"type":"text","text":"ab"},{"type":"image_url","image_url":{"url":"x"}}]'
    chat = b'{"model":"m","messages":[{"role":"user","content":' + content + b'}],"user":"u"}'
    r = parse_request("chat", chat, {})
    assert r.text == "ab" and r.session_id == "u" and r.user == "u"
    with pytest.raises(RequestError, match="max_tokens"):
        parse_request("completions", b'{"model":"m","prompt":"x","max_tokens":-1}', {})
    with pytest.raises(RequestError, match="prompt"):
        parse_request("completions", b'{"model":"m","prompt":[true]}', {})
