"""The import rules of docs/architecture.md, read from that document's table and checked
against every module's imports (top level, inside functions and type-only ones)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ("sandbox", "tools", "core", "serving", "bot", "trainer")


def rules(text: str) -> dict[str, tuple[set[str], set[str]]]:
    """room -> (the rooms it may import, the packages it must never import), from the
    table under "### Import rules"."""
    section = text.split("### Import rules", 1)[1].split("\n#", 1)[0]  # to the next heading
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in ROOMS:
            may, never = ({n for n in re.split(r"[,\s]+", c) if n} for c in cells[1:])
            table[cells[0]] = (may | {cells[0]}, never)
    return table


RULES = rules((ROOT / "docs/architecture.md").read_text())


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(f): f for room in ROOMS for f in sorted((ROOT / room).rglob("*.py"))}


def imports(path: Path) -> list[tuple[str, list[str], bool]]:
    """(module, names imported from it, inside a function) for each absolute import.
    Imports under ``if __name__ == "__main__":`` run in another module object: left out."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_main_guard(child.test):
                for branch in child.orelse:  # only the guarded body runs as __main__
                    visit_one(branch, in_function)
                continue
            visit_one(child, in_function)

    def visit_one(child: ast.AST, in_function: bool) -> None:
        inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
        if isinstance(child, ast.Import):
            found.extend((alias.name, [], in_function) for alias in child.names)
        elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
            found.append((child.module, [a.name for a in child.names], in_function))
        visit(child, inner)

    visit(ast.parse(path.read_text()), False)
    return found


def _is_main_guard(test: ast.expr) -> bool:
    return ast.unparse(test) in ("__name__ == '__main__'", "'__main__' == __name__")


def relative_imports(path: Path) -> list[int]:
    """Line numbers of ``from . import`` style imports (their room is implicit)."""
    return [n.lineno for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.ImportFrom) and n.level > 0]


def project_targets(module: str, names: list[str]) -> set[str]:
    """The project modules an import loads: ``from a.b import c`` is ``a.b.c`` when c is a
    module, else ``a.b``."""
    targets = {f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES}
    if module in MODULES and len(targets) < max(len(names), 1):
        targets.add(module)
    return targets


def graph() -> dict[str, set[str]]:
    return {m: {t for mod, names, _ in imports(f) for t in project_targets(mod, names)} - {m}
            for m, f in MODULES.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_document_states_a_rule_for_every_room():
    assert set(RULES) == set(ROOMS)
    assert RULES["sandbox"][0] == {"sandbox"}  # a leaf
    assert "trainer" not in RULES["bot"][0] and "bot" not in RULES["trainer"][0]
    assert "torch" in RULES["bot"][1]


@pytest.mark.parametrize("room", ROOMS)
def test_each_room_imports_only_what_the_architecture_allows(room):
    may, never = RULES[room]
    bad = [(str(f.relative_to(ROOT)), m) for name, f in MODULES.items() if name.split(".")[0] == room
           for m, _, _ in imports(f)
           if (m.split(".")[0] in ROOMS and m.split(".")[0] not in may) or m.split(".")[0] in never]
    assert bad == []


def test_no_circle_of_imports_between_modules_type_only_and_inner_ones_included():
    """An import inside a function or under TYPE_CHECKING counts: moving an import into a
    function does not cut a circle, it hides it."""
    assert circles(graph()) == []


def test_the_circle_finder_finds_a_planted_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(edges) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_a_rule_broken_in_a_planted_document_is_read_as_broken():
    text = "### Import rules\n| room | may import | never |\n|---|---|---|\n| bot | trainer | |\n"
    assert rules(text)["bot"] == ({"bot", "trainer"}, set())



def test_imports_are_absolute_so_each_names_its_room():
    bad = [(str(f.relative_to(ROOT)), line) for f in MODULES.values()
           for line in relative_imports(f)]
    assert bad == []


def test_every_top_level_package_is_a_room_and_no_room_imports_the_tests_or_benches():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert packages - {"tests", "bench"} == set(ROOMS)
    bad = [(str(f.relative_to(ROOT)), m) for f in MODULES.values() for m, _, _ in imports(f)
           if m.split(".")[0] in ("tests", "bench")]
    assert bad == []


def test_only_the_main_guard_is_left_out_and_its_else_branch_counts(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("if __name__ == '__main__':\n    import trainer.a\nelse:\n    import bot.b\n"
                      "if __name__ != '__main__':\n    import bot.c\n")
    assert [m for m, _, _ in imports(source)] == ["bot.b", "bot.c"]
    assert rules("### Import rules\n| bot | core | |\n## Later\n| bot | trainer | |\n") == {
        "bot": ({"bot", "core"}, set())}
