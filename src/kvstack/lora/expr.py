"""A small, safe rule language for cache policies: names, constants, comparisons, and/or/not.

``compile_rule("status == 'canary' and canary_percent > 0", types)`` parses the text with
:mod:`ast` and builds a tree of closures; nothing is ever passed to ``eval``. Every name must
be a known field, every constant a str, int, float, bool or None (or a tuple/list of them after
``in``), and a comparison must be between compatible types, so a typo fails when the config
loads, not when the first adapter is evicted. The compiled rule takes a mapping of field values.

Config-level: pure (no I/O, no state), it imports only :mod:`kvstack.errors`, so the ``lora``
section can check its rules when it loads without importing any runtime module.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvstack.errors import ConfigError

__all__ = ["Rule", "compile_rule", "rename_fields"]

Value = str | int | float | bool | None
Fields = Mapping[str, Any]
_Eval = Callable[[Fields], Any]

_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_NUMERIC = (int, float)


@dataclass(frozen=True)
class Rule:
    """A compiled rule; call it with the field values."""

    text: str
    _fn: _Eval

    def __call__(self, fields: Fields) -> bool:
        return bool(self._fn(fields))


def compile_rule(text: str, types: Mapping[str, type]) -> Rule:
    """Parse ``text`` into a :class:`Rule` over fields named in ``types`` (name -> Python type)."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ConfigError(f"rule {text!r} is not valid: {exc.msg}") from None
    fn, _ = _Compiler(text, types).visit(tree.body)
    return Rule(text, fn)


def rename_fields(text: str, renames: Mapping[str, str]) -> tuple[str, list[str]]:
    """``text`` with every field named in ``renames`` replaced by its new name, and the old
    names it used. Only names are replaced, never text inside a string constant; a rule that
    does not parse is returned as it is (:func:`compile_rule` then says why)."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return text, []
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in renames]
    if not found:
        return text, []
    lines = text.strip().split("\n")
    # From the last to the first, so earlier offsets stay valid. Offsets count UTF-8 bytes.
    for node in sorted(found, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        raw = lines[node.lineno - 1].encode()
        start, end = node.col_offset, node.end_col_offset or node.col_offset
        lines[node.lineno - 1] = (raw[:start] + renames[node.id].encode() + raw[end:]).decode()
    return "\n".join(lines), sorted({n.id for n in found})


class _Compiler:
    def __init__(self, text: str, types: Mapping[str, type]) -> None:
        self.text = text
        self.types = types

    def fail(self, why: str) -> ConfigError:
        return ConfigError(f"rule {self.text!r}: {why}")

    def visit(self, node: ast.expr) -> tuple[_Eval, type | None]:
        """Return an evaluator and the static type of ``node`` (None: unknown/None)."""
        if isinstance(node, ast.BoolOp):
            return self._boolop(node)
        if isinstance(node, ast.UnaryOp):
            return self._unary(node)
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.Name):
            return self._name(node)
        if isinstance(node, ast.Constant | ast.Tuple | ast.List):
            value = self._literal(node)
            return (lambda _f: value), _type_of(value)
        raise self.fail(
            f"{type(node).__name__} is not allowed; use names, constants, comparisons, and/or/not"
        )

    def _boolop(self, node: ast.BoolOp) -> tuple[_Eval, type | None]:
        parts = [self.visit(v)[0] for v in node.values]
        if isinstance(node.op, ast.And):
            return (lambda f: all(p(f) for p in parts)), bool
        return (lambda f: any(p(f) for p in parts)), bool

    def _unary(self, node: ast.UnaryOp) -> tuple[_Eval, type | None]:
        if isinstance(node.op, ast.Not):
            inner, _ = self.visit(node.operand)
            return (lambda f: not inner(f)), bool
        if isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            value = self._literal(node)
            return (lambda _f: value), _type_of(value)
        raise self.fail("only 'not' and a minus sign before a number are allowed")

    def _name(self, node: ast.Name) -> tuple[_Eval, type | None]:
        name = node.id
        if name in ("True", "False", "None"):
            raise self.fail(f"{name} must be written as a constant")
        if name not in self.types:
            known = ", ".join(sorted(self.types))
            raise self.fail(f"unknown field {name!r}; known fields: {known}")
        return (lambda f: f[name]), self.types[name]

    def _compare(self, node: ast.Compare) -> tuple[_Eval, type | None]:
        operands = [self.visit(node.left), *(self.visit(c) for c in node.comparators)]
        steps: list[tuple[Callable[[Any, Any], bool], _Eval, _Eval]] = []
        for i, op in enumerate(node.ops):
            (left, ltype), (right, rtype) = operands[i], operands[i + 1]
            self._check_types(op, ltype, rtype)
            steps.append((_COMPARE[type(op)], left, right))

        def evaluate(f: Fields) -> bool:
            return all(cmp(left(f), right(f)) for cmp, left, right in steps)

        return evaluate, bool

    def _check_types(self, op: ast.cmpop, ltype: type | None, rtype: type | None) -> None:
        if isinstance(op, ast.In | ast.NotIn):
            if rtype is not tuple:
                raise self.fail("'in' needs a list or tuple of constants on its right")
            return
        if ltype is None or rtype is None or ltype is rtype:
            return
        if ltype in _NUMERIC and rtype in _NUMERIC:
            return
        raise self.fail(f"cannot compare {ltype.__name__} with {rtype.__name__}")

    def _literal(self, node: ast.expr) -> Value | tuple[Value, ...]:
        try:
            value = ast.literal_eval(node)
        except ValueError:
            raise self.fail("only constants may appear in a list or tuple") from None
        if isinstance(value, list | tuple):
            if not all(_is_scalar(v) for v in value):
                raise self.fail("lists may hold only str, int, float, bool or None")
            return tuple(value)
        if not _is_scalar(value):
            raise self.fail(f"constant {value!r} is not a str, int, float, bool or None")
        return value  # type: ignore[no-any-return]


def _is_scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _type_of(value: object) -> type | None:
    if value is None:
        return None
    if isinstance(value, tuple):
        return tuple
    if isinstance(value, bool):
        return bool
    return type(value)
