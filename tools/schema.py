"""How a tool function's type hints and docstring become its JSON schema and argument checks.

Supported hints: str, int, float, bool, list[str], Literal[...] of strings or
ints, and Optional/``X | None`` of those (with a default). Checks are by hand
rather than by pydantic so each message names what was expected and what
came, in the model's terms (JSON types). Numbers quoted as strings are
accepted for int and float parameters: small models do that, and the intent
is clear.
"""

from __future__ import annotations

import inspect
import json
import re
import types
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin


class ToolError(ValueError):
    """A refusal the model can act on; its message is the observation. (Here, beside the
    argument errors, so that the journal can raise it without importing the registry.)"""


class ArgumentError(ValueError):
    """The model's arguments do not fit the tool's schema."""


def is_optional(hint: Any) -> bool:
    return get_origin(hint) in (Union, types.UnionType) and type(None) in get_args(hint)


def _inner(hint: Any) -> Any:
    """X for Optional[X]; raises for other unions."""
    rest = [a for a in get_args(hint) if a is not type(None)]
    if len(rest) != 1:
        raise TypeError(f"unsupported union {hint}")
    return rest[0]


def json_type(hint: Any) -> dict:
    if is_optional(hint):
        return json_type(_inner(hint))
    simple = {str: "string", bool: "boolean", int: "integer", float: "number"}
    if hint in simple:
        return {"type": simple[hint]}
    if get_origin(hint) is list and get_args(hint) == (str,):
        return {"type": "array", "items": {"type": "string"}}
    if get_origin(hint) is Literal:
        choices = get_args(hint)
        kinds = {type(c) for c in choices}
        if kinds == {str}:
            return {"type": "string", "enum": list(choices)}
        if kinds == {int}:
            return {"type": "integer", "enum": list(choices)}
    raise TypeError(f"unsupported tool parameter type {hint!r}")


def type_word(hint: Any) -> str:
    if is_optional(hint):
        return type_word(_inner(hint))
    if get_origin(hint) is Literal:
        return " | ".join(json.dumps(c) for c in get_args(hint))
    return {str: "string", bool: "boolean", int: "integer", float: "number"}.get(hint, "list of strings")


def check_value(value: Any, hint: Any) -> Any:
    """``value`` as the hint's type, or ArgumentError("<expected>; got <what>")."""
    if is_optional(hint):
        return None if value is None else check_value(value, _inner(hint))
    got = "null" if value is None else f"{_kind(value)} {_preview(value)}"
    if hint is str:
        if isinstance(value, str):
            return value
        raise ArgumentError(f"a string; got {got}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ArgumentError(f"true or false; got {got}")
    if hint is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
            return int(value)  # small models quote numbers; the intent is clear
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ArgumentError(f"an integer; got {got}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ArgumentError(f"a number; got {got}")
    if get_origin(hint) is list:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        raise ArgumentError(f"a list of strings; got {got}")
    if get_origin(hint) is Literal:
        if value in get_args(hint) and type(value) in {type(c) for c in get_args(hint)}:
            return value
        raise ArgumentError(f"one of {', '.join(json.dumps(c) for c in get_args(hint))}; got {got}")
    raise ArgumentError(f"{type_word(hint)}; got {got}")


def _kind(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
            dict: "object", type(None): "null"}.get(type(value), type(value).__name__)


def _preview(value: Any) -> str:
    simple = (str, int, float, bool, list, dict, type(None))
    text = json.dumps(value, default=repr) if isinstance(value, simple) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- docstrings ---------------------------------------------------------------------------

_SECTION = re.compile(r"^(Args|Arguments|Returns|Raises|Yields|Examples?|Notes?):\s*$")
_ARG_LINE = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The description (text before the first section) and the Args: descriptions."""
    lines = inspect.cleandoc(fn.__doc__ or "").splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section = None
    current = None
    args_indent = 0
    for line in lines:
        header = _SECTION.match(line)
        if header:
            section = header.group(1)
            continue
        if section is None:
            description.append(line)
        elif section in ("Args", "Arguments") and line.strip():
            match = _ARG_LINE.match(line.strip())
            indent = len(line) - len(line.lstrip())
            if match and (current is None or indent <= args_indent):
                current, args_indent = match.group(1), indent
                args[current] = match.group(2).strip()
            elif current is not None:
                args[current] = f"{args[current]} {line.strip()}".strip()
    # Hard-wrapped lines become one paragraph; blank lines still separate paragraphs.
    text = re.sub(r"(?<!\n)\n(?!\n)", " ", "\n".join(description).strip())
    return text, args
