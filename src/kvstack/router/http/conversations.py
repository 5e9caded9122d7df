"""The prompts of the Responses and Anthropic Messages APIs as chat messages, for routing.

vLLM serves both by rendering a chat conversation with the model's chat template: Responses'
``instructions`` become a system message ahead of ``input`` (a string is one user message;
message items keep their role and text parts); Anthropic's ``system`` becomes a system message
ahead of ``messages``. The router renders the same conversation, so prefix-aware routing sees the
tokens the engine computes (checked against a real engine's token counts in the tests). Items
that are not messages (tool calls, reasoning) carry no text the router needs: they are left
out, which can only shorten the prefix the router believes in, never lengthen it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["anthropic_messages", "batch_messages", "responses_messages"]

Messages = list[dict[str, Any]]


def _text_parts(content: object) -> str | None:
    """A message's content as one string: its text parts joined by newlines, as vLLM joins
    them for the (usual) chat templates that take string content."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [
        part["text"]
        for part in content
        if isinstance(part, Mapping) and isinstance(part.get("text"), str)
    ]
    return "\n".join(texts)


def _system_text(system: object) -> str | None:
    """Anthropic's ``system``: a string or a list of text blocks."""
    if isinstance(system, str):
        return system or None
    if isinstance(system, list):
        text = "".join(str(block.get("text", "")) for block in system if isinstance(block, Mapping))
        return text or None
    return None


def _message(item: object) -> dict[str, Any] | None:
    if not isinstance(item, Mapping) or not isinstance(item.get("role"), str):
        return None
    if item.get("type", "message") != "message":
        return None
    content = _text_parts(item.get("content"))
    if content is None:
        return None
    return {"role": item["role"], "content": content}


def responses_messages(body: Mapping[str, Any]) -> Messages | None:
    """``instructions`` and ``input`` of a Responses request as chat messages (None: none)."""
    messages: Messages = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    source = body.get("input")
    if isinstance(source, str):
        messages.append({"role": "user", "content": source})
    elif isinstance(source, list):
        messages.extend(m for item in source if (m := _message(item)) is not None)
    return messages or None


def anthropic_messages(body: Mapping[str, Any]) -> Messages | None:
    """``system`` and ``messages`` of an Anthropic Messages request as chat messages."""
    messages: Messages = []
    system = _system_text(body.get("system"))
    if system is not None:
        messages.append({"role": "system", "content": system})
    source = body.get("messages")
    if isinstance(source, list):
        messages.extend(m for item in source if (m := _message(item)) is not None)
    return messages or None


def batch_messages(body: Mapping[str, Any]) -> Messages | None:
    """A batch of chat conversations is routed on its first one."""
    source = body.get("messages")
    if isinstance(source, list) and source and isinstance(source[0], list):
        first = [m for item in source[0] if (m := _message(item)) is not None]
        return first or None
    return None
