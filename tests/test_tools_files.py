"""The file, search, recipe and update_sys tools, called through the registry as the agent calls them."""

from __future__ import annotations

import json

import os
from pathlib import Path

import pytest

from sandbox.paths import PathEscape, Workspace
from tools import ToolContext, default_registry
from tools.fsroot import FsRoot
from tools.system import read_sys_section, reset_sys_section

REGISTRY = default_registry()


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext.open("test", Workspace(tmp_path / "ws"), tmp_path / "state")


async def call(ctx: ToolContext, name: str, /, **arguments):
    return await REGISTRY.call(name, arguments, ctx)


async def ok(ctx: ToolContext, name: str, /, **arguments) -> str:
    result = await call(ctx, name, **arguments)
    assert result.ok, result.output
    return result.output


def write(ctx: ToolContext, path: str, text: str | bytes) -> Path:
    target = ctx.workspace.root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(text.encode() if isinstance(text, str) else text)
    return target


def content(ctx: ToolContext, path: str) -> str:
    return (ctx.workspace.root / path).read_text()


# --- read_file ---


async def test_read_file_pages_100_numbered_lines_and_says_how_to_read_on(ctx):
    write(ctx, "long.txt", "".join(f"line {i}\n" for i in range(1, 251)))
    first = await ok(ctx, "read_file", path="long.txt")
    assert first.splitlines()[0] == "long.txt: lines 1-100 of 250"
    assert first.splitlines()[1] == "     1\tline 1"
    assert "   100\tline 100" in first and "line 101" not in first
    assert "150 more lines" in first and "offset=101" in first
    last = await ok(ctx, "read_file", path="long.txt", offset=201, limit=500)
    assert "lines 201-250 of 250" in last and last.endswith("(end of file)")


async def test_read_file_refuses_binary_offsets_past_the_end_and_folders(ctx):
    write(ctx, "blob.bin", b"\x00\x01\x02binary")
    write(ctx, "short.txt", "a\nb\n")
    binary = await call(ctx, "read_file", path="blob.bin")
    assert not binary.ok and "binary file" in binary.output
    past = await call(ctx, "read_file", path="short.txt", offset=5)
    assert not past.ok and "past the end" in past.output and "2 lines" in past.output
    folder = await call(ctx, "read_file", path="scratch")
    assert not folder.ok and "folder" in folder.output
    missing = await call(ctx, "read_file", path="nope.txt")
    assert not missing.ok and "does not exist" in missing.output


async def test_read_file_cuts_very_long_lines(ctx):
    write(ctx, "wide.txt", "x" * 5000 + "\n")
    out = await ok(ctx, "read_file", path="wide.txt")
    assert "line cut, 3000 more characters" in out and len(out) < 2500


# --- write_file, edit_file ---


async def test_write_file_creates_parent_folders_and_overwrites(ctx):
    assert "created" in await ok(ctx, "write_file", path="a/b/c.txt", content="hello\n")
    assert content(ctx, "a/b/c.txt") == "hello\n"
    assert "overwrote" in await ok(ctx, "write_file", path="a/b/c.txt", content="bye")
    assert content(ctx, "a/b/c.txt") == "bye"


async def test_edit_file_replace_lines(ctx):
    write(ctx, "f.txt", "1\n2\n3\n4\n")
    out = await ok(ctx, "edit_file", path="f.txt", mode="replace_lines", start=2, end=3, text="two\nthree")
    assert content(ctx, "f.txt") == "1\ntwo\nthree\n4\n"
    assert "\ttwo" in out and "4 lines" in out


async def test_edit_file_insert_at_top_middle_and_end(ctx):
    write(ctx, "f.txt", "a\nb")
    await ok(ctx, "edit_file", path="f.txt", mode="insert", after=0, text="top")
    await ok(ctx, "edit_file", path="f.txt", mode="insert", after=2, text="mid")
    await ok(ctx, "edit_file", path="f.txt", mode="insert", after=4, text="end")
    assert content(ctx, "f.txt") == "top\na\nmid\nb\nend\n"


async def test_edit_file_delete_lines(ctx):
    write(ctx, "f.txt", "a\nb\nc\nd\n")
    await ok(ctx, "edit_file", path="f.txt", mode="delete_lines", start=2, end=3)
    assert content(ctx, "f.txt") == "a\nd\n"


async def test_edit_file_replace_text_needs_exactly_one_occurrence(ctx):
    write(ctx, "f.txt", "x = 1\ny = 1\n")
    twice = await call(ctx, "edit_file", path="f.txt", mode="replace_text", old=" = 1", new=" = 2")
    assert not twice.ok and "occurs 2 times" in twice.output
    never = await call(ctx, "edit_file", path="f.txt", mode="replace_text", old="z = 1", new="")
    assert not never.ok and "occurs 0 times" in never.output
    await ok(ctx, "edit_file", path="f.txt", mode="replace_text", old="y = 1", new="y = 2")
    assert content(ctx, "f.txt") == "x = 1\ny = 2\n"


async def test_edit_file_names_missing_mode_arguments_and_bad_ranges(ctx):
    write(ctx, "f.txt", "a\nb\n")
    missing = await call(ctx, "edit_file", path="f.txt", mode="replace_lines", start=1)
    assert not missing.ok and "missing: end, text" in missing.output
    bad = await call(ctx, "edit_file", path="f.txt", mode="delete_lines", start=2, end=9)
    assert not bad.ok and "has 2 lines" in bad.output
    assert content(ctx, "f.txt") == "a\nb\n"


async def test_edit_file_keeps_windows_line_endings(ctx):
    write(ctx, "crlf.txt", "a\r\nb\r\n")
    await ok(ctx, "edit_file", path="crlf.txt", mode="insert", after=1, text="new")
    assert (ctx.workspace.root / "crlf.txt").read_bytes() == b"a\r\nnew\r\nb\r\n"


# --- list_dir, make_dir, delete, clear_scratch ---


async def test_list_dir_shows_folders_first_and_sizes(ctx):
    write(ctx, "z.txt", "12345")
    await ok(ctx, "make_dir", path="docs/inner")
    out = await ok(ctx, "list_dir")
    assert out.splitlines()[1:] == ["docs/", "scratch/", "z.txt  (5 bytes)"]
    assert "already exists" in await ok(ctx, "make_dir", path="docs")


async def test_delete_removes_files_and_whole_folders(ctx):
    write(ctx, "d/e/f.txt", "x")
    write(ctx, "g.txt", "y")
    await ok(ctx, "delete", path="d")
    await ok(ctx, "delete", path="g.txt")
    assert sorted(os.listdir(ctx.workspace.root)) == ["scratch"]
    root = await call(ctx, "delete", path=".")
    assert not root.ok and "workspace itself" in root.output


async def test_delete_of_a_link_removes_the_link_not_its_target(ctx):
    write(ctx, "real/keep.txt", "x")
    os.symlink("real", ctx.workspace.root / "alias")
    await ok(ctx, "delete", path="alias")
    assert (ctx.workspace.root / "real/keep.txt").exists()
    assert not os.path.lexists(ctx.workspace.root / "alias")


async def test_clear_scratch_empties_it_and_undo_brings_it_back(ctx):
    write(ctx, "scratch/tmp/a.txt", "a")
    write(ctx, "scratch/b.txt", "b")
    assert "2 entries" in await ok(ctx, "clear_scratch")
    assert os.listdir(ctx.workspace.root / "scratch") == []
    await ok(ctx, "undo")
    assert content(ctx, "scratch/tmp/a.txt") == "a"


# --- search ---


async def test_grep_reports_file_line_and_respects_glob(ctx):
    write(ctx, "src/a.py", "import os\ndef main():\n    pass\n")
    write(ctx, "notes.md", "def not python\n")
    out = await ok(ctx, "grep", pattern=r"^def \w+", glob="*.py")
    assert out.splitlines()[0] == "src/a.py:2: def main():"
    assert "notes.md" not in out
    bad = await call(ctx, "grep", pattern="(unclosed")
    assert not bad.ok and "invalid regular expression" in bad.output


async def test_grep_caps_matches(ctx):
    write(ctx, "many.txt", "hit\n" * 500)
    out = await ok(ctx, "grep", pattern="hit")
    assert out.count("many.txt:") == 100 and "stopped after 100 matches" in out


async def test_glob_matches_recursive_patterns(ctx):
    write(ctx, "a.py", "")
    write(ctx, "pkg/b.py", "")
    write(ctx, "pkg/sub/c.py", "")
    write(ctx, "pkg/readme.md", "")
    assert (await ok(ctx, "glob", pattern="**/*.py")).splitlines() == ["a.py", "pkg/b.py", "pkg/sub/c.py"]
    assert (await ok(ctx, "glob", pattern="pkg/*")).splitlines() == ["pkg/b.py", "pkg/readme.md", "pkg/sub/"]
    escape = await call(ctx, "glob", pattern="../*")
    assert not escape.ok and ".." in escape.output


def test_glob_matching_agrees_with_trying_every_split_of_each_double_star():
    import fnmatch
    import itertools
    import random

    from tools.search import _match

    def every_split(names, parts):  # the old exponential definition, as the reference
        if not parts:
            return not names
        if parts[0] == "**":
            return any(every_split(names[i:], parts[1:]) for i in range(len(names) + 1))
        return bool(names) and fnmatch.fnmatchcase(names[0], parts[0]) \
            and every_split(names[1:], parts[1:])

    rng = random.Random(7)
    words = ["a", "b", "ab", "*", "a*", "**", "?"]
    for _ in range(3000):
        names = [rng.choice(["a", "b", "ab", "ba"]) for _ in range(rng.randint(0, 5))]
        parts = [rng.choice(words) for _ in range(rng.randint(1, 5))]
        assert _match(names, parts) == every_split(names, parts), (names, parts)
    assert not any(_match(list(p), ["x"]) for p in itertools.product("ab", repeat=2))


def test_glob_matching_costs_at_most_names_times_parts_comparisons(monkeypatch):
    """40 ** on a 10-deep tree held a thread for ever (issue 40): now bounded, not timed."""
    import fnmatch

    from tools.search import _match

    calls = []
    real = fnmatch.fnmatchcase
    monkeypatch.setattr(fnmatch, "fnmatchcase", lambda n, p: calls.append(1) or real(n, p))
    names = ["d"] * 10
    parts = ["**", "x*"] * 16  # the most parts a pattern may have, none collapsible
    assert _match(names, parts) is False
    assert len(calls) <= len(names) * len(parts)


async def test_glob_collapses_repeated_double_stars_and_caps_its_parts(ctx):
    write(ctx, "/".join("d" * 10) + "/f.py", "")
    found = await ok(ctx, "glob", pattern="/".join(["**"] * 40) + "/*.py")
    assert found == "/".join("d" * 10) + "/f.py"
    long = await call(ctx, "glob", pattern="/".join(["**", "d"] * 20))
    assert not long.ok and "the pattern has 40 parts; at most 32" in long.output


async def test_tree_shows_nested_folders_to_the_given_depth(ctx):
    write(ctx, "a/b/c/deep.txt", "")
    out = await ok(ctx, "tree", depth=2)
    assert out.splitlines() == ["./", "  a/", "    b/", "  scratch/"]
    assert "deep.txt" in await ok(ctx, "tree", path="a", depth=3)


async def test_file_info_tells_type_size_and_lines(ctx):
    write(ctx, "t.txt", "a\nb\nc\n")
    write(ctx, "b.bin", b"\x00\xff")
    assert "text file, 6 bytes, 3 lines" in await ok(ctx, "file_info", path="t.txt")
    assert "binary file, 2 bytes" in await ok(ctx, "file_info", path="b.bin")
    assert "folder with 0 entries" in await ok(ctx, "file_info", path="scratch")


async def test_outline_lists_classes_functions_with_lines_and_signatures(ctx):
    write(ctx, "m.py", "class A(Base):\n    def f(self, x: int = 1) -> str:\n        return ''\n\n"
                       "    @staticmethod\n    async def g():\n        pass\n\n"
                       "def top(*args, **kw):\n    pass\n")
    out = await ok(ctx, "outline", path="m.py")
    assert out.splitlines() == [
        "m.py (10 lines)",
        "class A(Base)  [1-7]",
        "    def f(self, x: int=1) -> str  [2-3]",
        "    @staticmethod async def g()  [5-7]",
        "def top(*args, **kw)  [9-10]",
    ]


async def test_outline_reports_syntax_errors_with_their_line(ctx):
    write(ctx, "bad.py", "x = 1\ndef broken(:\n")
    result = await call(ctx, "outline", path="bad.py")
    assert not result.ok and "syntax error at line 2" in result.output


# --- recipes ---


async def test_recipes_save_list_fill_and_name_missing_parameters(ctx):
    saved = await ok(ctx, "save_recipe", name="summary", template="Summarise {file} in {words} words. {{ok}}")
    assert "parameters: file, words" in saved
    assert "summary(file, words)" in await ok(ctx, "list_recipes")
    filled = await ok(ctx, "fill_recipe", name="summary", values_json='{"file": "a.txt", "words": 50}')
    assert filled == "Summarise a.txt in 50 words. {ok}"
    missing = await call(ctx, "fill_recipe", name="summary", values_json='{"file": "a.txt"}')
    assert not missing.ok and "missing words" in missing.output
    unknown = await call(ctx, "fill_recipe", name="nope", values_json="{}")
    assert not unknown.ok and "summary" in unknown.output
    assert (ctx.state_dir / "recipes.json").exists()


async def test_save_recipe_refuses_attribute_and_positional_fields(ctx):
    for template in ("{a.__class__}", "{}", "{x[0]}", "unclosed {"):
        result = await call(ctx, "save_recipe", name="r", template=template)
        assert not result.ok, template


async def test_a_format_spec_is_refused_at_save_and_at_fill_never_run(ctx):
    """{x:>100000000} grew the bot by 381 MiB before the output was cut (issue 40)."""
    for template in ("{x:>100000000}", "{x!r}", "{x:05d}", "pad {x:{y}}"):
        result = await call(ctx, "save_recipe", name="r", template=template)
        assert not result.ok and "format spec or conversion" in result.output, template
    # A recipe stored before the rule (written straight to the file) is refused when filled.
    (ctx.state_dir / "recipes.json").write_text(json.dumps(
        {"old": {"template": "{x:>100000000}", "params": ["x"], "saved": 0}}))
    old = await call(ctx, "fill_recipe", name="old", values_json='{"x": "a"}')
    assert not old.ok and "format spec or conversion" in old.output


async def test_a_filled_recipe_is_measured_before_it_is_built(ctx):
    await ok(ctx, "save_recipe", name="many", template="{v}" * 200)
    big = await call(ctx, "fill_recipe", name="many", values_json=json.dumps({"v": "x" * 1000}))
    assert not big.ok and "would be 200000 characters; the limit is 100000" in big.output
    small = await ok(ctx, "fill_recipe", name="many", values_json='{"v": "ab"}')
    assert small == "ab" * 200


# --- update_sys ---


async def test_update_sys_view_replace_append_delete_and_undo(ctx):
    assert "empty" in await ok(ctx, "update_sys", action="view")
    await ok(ctx, "update_sys", action="replace", text="be brief")
    await ok(ctx, "update_sys", action="append", text="use metric units\nsay please")
    assert read_sys_section(ctx.state_dir) == "be brief\nuse metric units\nsay please\n"
    await ok(ctx, "update_sys", action="delete", line=2)
    assert read_sys_section(ctx.state_dir) == "be brief\nsay please\n"
    assert "     2\tsay please" in await ok(ctx, "update_sys", action="view")
    bad = await call(ctx, "update_sys", action="delete", line=7)
    assert not bad.ok and "between 1 and 2" in bad.output
    await ok(ctx, "undo")
    assert read_sys_section(ctx.state_dir) == "be brief\nuse metric units\nsay please\n"
    reset_sys_section(ctx)
    assert read_sys_section(ctx.state_dir) == ""
    ctx.journal.undo()
    assert read_sys_section(ctx.state_dir).startswith("be brief")


async def test_update_sys_refuses_a_section_over_the_limit(ctx):
    result = await call(ctx, "update_sys", action="replace", text="x" * 5000)
    assert not result.ok and "limit is 4000" in result.output
    assert read_sys_section(ctx.state_dir) == ""


# --- the jail ---

ESCAPES = ["../outside.txt", "/etc/passwd", "a/../../x", "link_out/secret.txt"]


@pytest.mark.parametrize("path", ESCAPES)
@pytest.mark.parametrize("name, extra", [
    ("read_file", {}), ("write_file", {"content": "x"}), ("list_dir", {}), ("make_dir", {}),
    ("delete", {}), ("file_info", {}), ("outline", {}), ("grep", {"pattern": "x"}),
    ("edit_file", {"mode": "delete_lines", "start": 1, "end": 1}),
])
async def test_paths_leading_out_of_the_workspace_are_refused_with_the_jails_message(
        ctx, tmp_path, name, extra, path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    os.symlink(outside, ctx.workspace.root / "link_out")
    with pytest.raises(PathEscape) as jail:
        ctx.workspace.resolve(path)
    result = await call(ctx, name, path=path, **extra)
    assert not result.ok
    assert str(jail.value) in result.output
    assert (outside / "secret.txt").read_text() == "secret"
    assert not (tmp_path / "outside.txt").exists()


def test_a_folder_swapped_for_a_link_after_the_jail_check_is_not_followed(ctx, tmp_path):
    """The TOCTOU gap: a job swaps a checked folder for a link out before the tool writes."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (ctx.workspace.root / "d").mkdir()
    checked = ctx.workspace.resolve("d/x.txt")
    (ctx.workspace.root / "d").rmdir()
    os.symlink(outside, ctx.workspace.root / "d")
    with pytest.raises(PathEscape):
        with ctx.journal.change("write_file d/x.txt") as tx:
            tx.write(checked, b"leak")
    with pytest.raises(PathEscape):
        FsRoot(ctx.workspace.root).read("d/x.txt")
    assert list(outside.iterdir()) == []
    assert ctx.journal.log()[0] == []
