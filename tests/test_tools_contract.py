"""The contract every registered tool keeps: a valid, documented schema and clear errors for bad arguments."""

from __future__ import annotations

from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from sandbox.paths import Workspace
from tools import Tool, ToolContext, default_registry
from tools.schema import is_optional

REGISTRY = default_registry()

# A value of the wrong JSON type for each kind of parameter.
WRONG = {"string": 12345, "integer": "twelve", "number": "many", "boolean": "maybe",
         "array": "not a list"}
VALID = {"string": "x", "integer": 1, "number": 1.0, "boolean": True, "array": ["x"]}


def _valid_value(spec: dict):
    return spec["enum"][0] if "enum" in spec else VALID[spec["type"]]


@pytest.mark.parametrize("t", [REGISTRY.get(n) for n in REGISTRY.names()], ids=REGISTRY.names())
async def test_tool_contract(t: Tool, tmp_path: Path):
    schema = t.schema()
    function = schema["function"]
    parameters = function["parameters"]
    Draft202012Validator.check_schema(parameters)
    assert schema["type"] == "function" and function["name"] == t.name
    assert function["description"].strip(), f"{t.name} has no description"
    for name, spec in parameters["properties"].items():
        assert spec.get("description", "").strip(), f"{t.name}.{name} has no description"
    ctx = ToolContext.open("contract", Workspace(tmp_path / "ws"), tmp_path / "state")
    base = {name: _valid_value(spec) for name, spec in parameters["properties"].items()}

    async def refused(arguments, *must_mention: str) -> None:
        result = await REGISTRY.call(t.name, arguments, ctx)  # must not raise
        assert not result.ok, f"{t.name} accepted {arguments!r}"
        assert result.meta["error"] == "arguments"
        for word in must_mention:
            assert word in result.output, f"{t.name}: {word!r} not in {result.output!r}"

    for name, spec in parameters["properties"].items():
        param = next(p for p in t.params if p.name == name)
        await refused({**base, name: WRONG[spec["type"]]}, name)
        if "enum" in spec:
            await refused({**base, name: "no-such-choice"}, name, spec["enum"][0])
        if not is_optional(param.hint):
            await refused({**base, name: None}, name)
    for name in parameters["required"]:
        await refused({k: v for k, v in base.items() if k != name}, name, "missing")
    await refused({**base, "bogus_arg": 1}, "bogus_arg")
    await refused("{not json", "JSON")
    await refused("[1, 2]", "JSON object")

