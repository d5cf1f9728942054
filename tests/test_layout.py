"""The import rules of bot/__init__.py, read from the source with ast."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRAINER_MAY_IMPORT = {"bot.config", "bot.storage.store", "bot.storage.embedder",
                      "bot.serving.wire", "bot.serving.chat_format",
                      "bot.serving.shim",  # the gate generates with the server's handler patches
                      "bot.practice.sets",  # standard library only: the gate's held-out items
                      "bot.practice.checks",  # sets and the sandbox: the gate's python checks
                      # `python -m trainer sleep` run by hand, with no bot: it serves the live
                      # model itself, the way the bot does (neither imports discord or torch).
                      "bot.serving.supervisor", "bot.night.releases"}
# Imports inside functions that load a heavy or optional dependency when used.
# (The embedder loads its model, notes load chromadb, the front ends load discord.py.)
LAZY_OK = {"bot.storage.embedder", "tools.notes", "bot.discord_front.app", "bot.doctor",
           "bot.serving.prompt_cache",  # in the server process only: it loads llama_cpp
           "bot.app"}


def imports(path: Path) -> list[tuple[str, bool]]:
    """(module, inside a function) for each import of a file."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((alias.name, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append((child.module, in_function))
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # typing only: never runs
            visit(child, inner)

    visit(tree, False)
    return found


def package_files(name: str) -> list[Path]:
    return sorted((ROOT / name).rglob("*.py"))


def top(module: str) -> str:
    return module.split(".")[0]


@pytest.mark.parametrize("package", ["bot", "tools", "sandbox"])
def test_the_day_side_never_imports_torch_or_the_trainer(package):
    bad = [(f.relative_to(ROOT), m) for f in package_files(package) for m, _ in imports(f)
           if top(m) in ("torch", "transformers", "peft", "accelerate", "trainer")]
    assert bad == []


def test_the_sandbox_is_a_leaf():
    bad = [(f.relative_to(ROOT), m) for f in package_files("sandbox") for m, _ in imports(f)
           if top(m) in ("bot", "tools", "trainer")]
    assert bad == []


def test_tools_import_only_the_sandbox_of_the_project():
    bad = [(f.relative_to(ROOT), m) for f in package_files("tools") for m, _ in imports(f)
           if top(m) in ("bot", "trainer")]
    assert bad == []


def test_the_trainer_imports_only_the_allowed_bot_modules():
    used = {m for f in package_files("trainer") for m, _ in imports(f) if top(m) == "bot"}
    assert used <= TRAINER_MAY_IMPORT, used - TRAINER_MAY_IMPORT


def test_no_bot_module_imports_another_inside_a_function_to_dodge_a_cycle():
    inner = [(str(f.relative_to(ROOT)), m) for f in package_files("bot")
             for m, in_function in imports(f)
             if in_function and top(m) in ("bot", "tools", "sandbox") and m not in LAZY_OK]
    assert inner == []


def test_no_file_outgrows_the_size_guideline():
    long = [(str(f.relative_to(ROOT)), n) for package in ("bot", "tools", "sandbox", "trainer")
            for f in package_files(package) if (n := len(f.read_text().splitlines())) > 450]
    assert long == []


def test_practice_sets_import_only_the_standard_library():
    """The trainer's gate reads held-out items through it, so it must stay this light."""
    project = [m for m, _ in imports(ROOT / "bot/practice/sets.py")
               if top(m) in ("bot", "tools", "sandbox", "trainer", "pydantic", "discord")]
    assert project == []
