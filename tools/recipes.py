"""Recipes: named text templates with {param} placeholders the agent saves and fills later.

A recipe is a reusable prompt, command line or snippet. Placeholders are
plain names (``{city}``); ``{{`` and ``}}`` stand for literal braces. Positional
(``{}``), attribute (``{a.b}``) and index (``{a[0]}``) fields are refused, and so
are format specs and conversions (``{x:>100000000}`` asked for a 100 MB string):
filling a recipe is plain substitution and nothing else, its result capped at
``MAX_FILLED_CHARS`` before it is built.

Recipes live in the channel's state dir (``recipes.json``), outside the
workspace, written by temp file and ``os.replace``. They are not part of the
undo journal: undo is about the workspace and the system-prompt section.
"""

from __future__ import annotations

import json
import re
import string
import time
from pathlib import Path

from tools import ToolContext, ToolError, tool
from tools.fsroot import atomic_write

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TEMPLATE_CHARS = 20_000
MAX_RECIPES = 200
MAX_FILLED_CHARS = 100_000


def template_params(template: str) -> list[str]:
    """The placeholder names in order of first use; ToolError for a malformed template."""
    names: list[str] = []
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ToolError(f"the template is malformed ({exc}); write literal braces as {{{{ and }}}}") from None
    for _, field, spec, conversion in fields:
        if field is None:
            continue
        if not field.isidentifier():
            raise ToolError(f"placeholder {{{field}}} is not a plain name; use names like {{city}} "
                            f"(letters, digits, _), and {{{{ }}}} for literal braces")
        if spec or conversion:
            shown = field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            raise ToolError(f"placeholder {{{shown}}} has a format spec or conversion; recipes "
                            f"only substitute: write {{{field}}} and put the text in the value")
        if field not in names:
            names.append(field)
    return names


def _path(ctx: ToolContext) -> Path:
    return ctx.state_dir / "recipes.json"


def _load(ctx: ToolContext) -> dict[str, dict]:
    try:
        return json.loads(_path(ctx).read_text())
    except FileNotFoundError:
        return {}


def _store(ctx: ToolContext, recipes: dict[str, dict]) -> None:
    atomic_write(_path(ctx), json.dumps(recipes, indent=1, sort_keys=True).encode())


@tool
def save_recipe(ctx: ToolContext, name: str, template: str) -> str:
    """Save a reusable text template under a name; {param} marks a value to fill in later,
    {{ and }} are literal braces. Saving under an existing name replaces that recipe.

    Args:
        name: The recipe's name: letters, digits, _ and -, up to 64 characters.
        template: The text, e.g. "Summarise {file} in {words} words."
    """
    if not NAME.fullmatch(name):
        raise ToolError(f"recipe name {name!r} is not allowed; use letters, digits, _ and -, up to 64")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise ToolError(f"the template has {len(template)} characters; the limit is {MAX_TEMPLATE_CHARS}")
    params = template_params(template)
    recipes = _load(ctx)
    if name not in recipes and len(recipes) >= MAX_RECIPES:
        raise ToolError(f"there are already {MAX_RECIPES} recipes; delete_recipe one first")
    replaced = name in recipes
    recipes[name] = {"template": template, "params": params, "saved": time.time()}
    _store(ctx, recipes)
    shown = ", ".join(params) if params else "none"
    return f"{'replaced' if replaced else 'saved'} recipe {name!r} (parameters: {shown})"


@tool
def list_recipes(ctx: ToolContext) -> str:
    """List your saved recipes with their parameters and first line."""
    recipes = _load(ctx)
    if not recipes:
        return "no recipes saved yet; save_recipe makes one"
    lines = []
    for name, recipe in sorted(recipes.items()):
        first = recipe["template"].strip().splitlines()[0] if recipe["template"].strip() else ""
        if len(first) > 80:
            first = first[:77] + "..."
        lines.append(f"{name}({', '.join(recipe['params'])}): {first}")
    return "\n".join(lines)


@tool
def fill_recipe(ctx: ToolContext, name: str, values_json: str = "{}") -> str:
    """Fill a saved recipe's placeholders and return the resulting text.

    Args:
        name: The recipe's name.
        values_json: A JSON object mapping each parameter to its value, e.g. {"file": "a.txt"}.
    """
    recipe = _load(ctx).get(name)
    if recipe is None:
        known = ", ".join(sorted(_load(ctx))) or "none yet"
        raise ToolError(f"there is no recipe {name!r}; the recipes are: {known}")
    try:
        values = json.loads(values_json) if values_json.strip() else {}
    except json.JSONDecodeError as exc:
        raise ToolError(f"values_json is not valid JSON ({exc.msg}); give an object like "
                        f'{{"{(recipe["params"] or ["param"])[0]}": "value"}}') from None
    if not isinstance(values, dict):
        raise ToolError("values_json must be a JSON object mapping parameter names to values")
    params = recipe["params"]
    missing = [p for p in params if p not in values]
    extra = [k for k in values if k not in params]
    if missing or extra:
        problems = []
        if missing:
            problems.append(f"missing {', '.join(missing)}")
        if extra:
            problems.append(f"unknown {', '.join(extra)}")
        raise ToolError(f"recipe {name!r} takes {', '.join(params) or 'no parameters'}; "
                        f"{' and '.join(problems)}")
    text_values = {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}
    return substitute(name, recipe["template"], text_values)


def substitute(name: str, template: str, values: dict[str, str]) -> str:
    """The template with each placeholder replaced by its value, measured before it is
    built. A recipe saved before specs were refused is checked again here."""
    pieces = list(string.Formatter().parse(template))
    template_params(template)  # a spec or conversion stored earlier: refused, never run
    size = sum(len(text) + (len(values[field]) if field is not None else 0)
               for text, field, _, _ in pieces)
    if size > MAX_FILLED_CHARS:
        raise ToolError(f"recipe {name!r} filled would be {size} characters; the limit is "
                        f"{MAX_FILLED_CHARS}: use shorter values")
    return "".join(text + (values[field] if field is not None else "")
                   for text, field, _, _ in pieces)


@tool
def delete_recipe(ctx: ToolContext, name: str) -> str:
    """Delete a saved recipe.

    Args:
        name: The recipe's name.
    """
    recipes = _load(ctx)
    if name not in recipes:
        raise ToolError(f"there is no recipe {name!r}; list_recipes shows them")
    del recipes[name]
    _store(ctx, recipes)
    return f"deleted recipe {name!r}"
