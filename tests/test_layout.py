"""The layout's size rules: small files, a light practice-set reader, a short bot/ top.
(The import rules are tests/test_architecture.py's.)"""

from __future__ import annotations

from pathlib import Path

from tests.test_architecture import imports

ROOT = Path(__file__).resolve().parent.parent


def test_no_file_outgrows_the_size_guideline():
    long = [(str(f.relative_to(ROOT)), n)
            for package in ("bot", "core", "serving", "tools", "sandbox", "trainer")
            for f in sorted((ROOT / package).rglob("*.py"))
            if (n := len(f.read_text().splitlines())) > 450]
    assert long == []


def test_bot_top_holds_at_most_15_files():
    assert len([f for f in (ROOT / "bot").iterdir() if f.is_file()]) <= 15


def test_practice_sets_import_only_the_standard_library():
    """The trainer's gate reads held-out items through it, so it must stay this light."""
    project = [m for m, _, _ in imports(ROOT / "core/practice/sets.py")
               if m.split(".")[0] in ("bot", "tools", "sandbox", "trainer", "pydantic", "discord")]
    assert project == []
