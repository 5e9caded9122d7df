"""The fenced blocks of the docs and the ``docs-test`` markers beside them.

The grammar is described in :mod:`tests.test_docs_commands`; this module only reads it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The documents a reader follows: their command and config blocks are tests.
DOCS = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
        "benchmarks/README.md")  # fmt: skip
# Blocks in these languages are commands or configs: each one is run, checked or skipped.
MARKED = frozenset({"bash", "sh", "shell", "console", "yaml", "yml"})
# Pictures, protocol sketches and message examples: nothing to run.
PROSE = frozenset({"text", "json"})
ACTIONS = {"run": {"timeout", "sub", "serve"}, "config": {"sub"}, "skip": {"reason"}}
MARKER = re.compile(r"^\s*<!--\s*docs-test:(?P<body>.*?)-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
FILE_NAME = re.compile(r"^#\s*(?P<name>[\w.-]+\.ya?ml)\b")


class MarkerError(ValueError):
    """A block without a marker it needs, or a marker outside the grammar."""


@dataclass(frozen=True)
class Marker:
    action: str
    timeout: float = 30.0
    subs: tuple[tuple[str, str], ...] = ()
    serve: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    marker: Marker | None = field(default=None)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def file_name(self) -> str | None:
        """``router.yaml`` for a config block whose first line is ``# router.yaml``."""
        first = self.text.lstrip().splitlines()[0] if self.text.strip() else ""
        found = FILE_NAME.match(first)
        return found["name"] if found else None

    def substituted(self, values: dict[str, str]) -> str:
        """The text with the marker's substitutions, placeholders in replacements filled in."""
        text = self.text
        for old, new in self.marker.subs if self.marker else ():
            if old not in text:
                raise MarkerError(f"{self.where}: sub {old!r} matches nothing in the block")
            for name, value in values.items():
                new = new.replace("{" + name + "}", value)
            text = text.replace(old, new)
        return text


def parse_marker(body: str, where: str) -> Marker:
    try:
        words = shlex.split(body)
    except ValueError as exc:
        raise MarkerError(f"{where}: cannot read the marker: {exc}") from None
    if not words or words[0] not in ACTIONS:
        raise MarkerError(f"{where}: a marker starts with one of {sorted(ACTIONS)}")
    action, options = words[0], words[1:]
    subs: list[tuple[str, str]] = []
    serve: list[str] = []
    values: dict[str, str] = {}
    for option in options:
        key, eq, value = option.partition("=")
        if not eq or key not in ACTIONS[action]:
            allowed = ", ".join(sorted(ACTIONS[action])) or "nothing"
            raise MarkerError(f"{where}: {action} takes {allowed}, not {option!r}")
        if key == "sub":
            old, arrow, new = value.partition("=>")
            if not arrow or not old:
                raise MarkerError(f'{where}: sub is "TEXT=>REPLACEMENT", got {value!r}')
            subs.append((old, new))
        elif key == "serve":
            serve.append(value)
        else:
            values[key] = value
    if action == "skip" and not values.get("reason"):
        raise MarkerError(f'{where}: skip needs reason="why it cannot run in CI"')
    return Marker(
        action,
        timeout=float(values.get("timeout", 30)),
        subs=tuple(subs),
        serve=tuple(serve),
        reason=values.get("reason", ""),
    )


def read_blocks(doc: str) -> list[Block]:
    """Every fenced block of ``doc`` with the marker on the line before it, if any; raises
    :class:`MarkerError` for an untagged fence, an unmarked command or config block, a marker
    a block does not follow, and a marker outside the grammar."""
    lines = (ROOT / doc).read_text().splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    pending: tuple[Marker | None, int] | None = None
    i = 0
    while i < len(lines):
        found_marker = MARKER.match(lines[i])
        fence = FENCE.match(lines[i])
        try:
            if found_marker:
                pending = (None, i)  # stays pending (and unparsed) if the marker is refused
                pending = (parse_marker(found_marker["body"], f"{doc}:{i + 1}"), i)
            elif fence:
                start, i = i, _closing_fence(lines, i, doc)
                marker, pending = (pending[0] if pending else None), None
                blocks.append(_block(doc, start, fence["lang"], lines[start + 1 : i],
                                     fence["indent"], marker))  # fmt: skip
            elif pending and lines[i].strip():
                where, pending = pending[1], None
                raise MarkerError(f"{doc}:{where + 1}: a marker goes on the line before a fence")
        except MarkerError as exc:
            problems.append(str(exc))
        i += 1
    if problems:
        raise MarkerError("\n".join(problems))
    return blocks


def _closing_fence(lines: list[str], start: int, doc: str) -> int:
    for j in range(start + 1, len(lines)):
        if lines[j].strip() == "```":
            return j
    raise MarkerError(f"{doc}:{start + 1}: the block never closes")


def _block(
    doc: str, i: int, lang: str, body: list[str], indent: str, marker: Marker | None
) -> Block:
    where = f"{doc}:{i + 1}"
    if not lang:
        raise MarkerError(f"{where}: say what the block is (```text for a picture, ```bash ...)")
    if lang not in MARKED | PROSE:
        raise MarkerError(f"{where}: ```{lang} is neither a command, a config nor prose")
    if lang in PROSE and marker is not None:
        raise MarkerError(f"{where}: a ```{lang} block runs nothing; drop its marker")
    if lang in MARKED and marker is None:
        raise MarkerError(
            f"{where}: ```{lang} block without a docs-test marker (run, config or skip)"
        )
    if marker and marker.action == "config" and lang not in ("yaml", "yml"):
        raise MarkerError(f"{where}: config is for yaml blocks")
    if marker and marker.action == "run" and lang in ("yaml", "yml"):
        raise MarkerError(f"{where}: a yaml block is checked with config, not run")
    text = "\n".join(line.removeprefix(indent) for line in body) + "\n"
    return Block(doc, i + 1, lang, text, marker)


def console_commands(text: str) -> str:
    """The commands of a ```console block: ``$ `` lines and their continuations."""
    out: list[str] = []
    continued = False
    for line in text.splitlines():
        if line.startswith("$ ") or continued:
            out.append(line.removeprefix("$ "))
            continued = line.endswith("\\")
    return "\n".join(out) + "\n"
