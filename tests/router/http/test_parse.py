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
    # What routing cannot use is left for the engine to judge, never refused here.
    r = parse_request("completions", b'{"model":"m","prompt":[true],"max_tokens":-1}', {})
    assert (r.token_ids, r.max_tokens, r.text) == (None, None, "")
    # Read as vLLM's pydantic models read them.
    r = parse_request("completions", b'{"model":"m","prompt":"x","max_tokens":"7","stream":1}', {})
    assert (r.max_tokens, r.stream) == (7, True)
    with pytest.raises(RequestError, match="model"):
        parse_request("completions", b'{"prompt":"x"}', {})


def test_responses_and_messages_prompts_render_as_chat() -> None:
    body = (
        b'{"model":"m","instructions":"be brief","max_output_tokens":5,"input":[{"role":"user",'
        b'"content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},'
        b'{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]}'
    )
    r = parse_request("responses", body, {})
    assert r.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a\nb"},
    ]
    assert r.max_tokens == 5
    r = parse_request("responses", b'{"model":"m","input":"hi"}', {})
    assert r.messages == [{"role": "user", "content": "hi"}]
    body = (
        b'{"model":"m","max_tokens":9,"system":[{"type":"text","text":"sys"}],'
        b'"messages":[{"role":"user","content":[{"type":"text","text":"q"}]}]}'
    )
    r = parse_request("messages", body, {})
    assert r.messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}]
    assert r.max_tokens == 9 and r.text == "sysq"
