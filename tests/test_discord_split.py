"""split_reply: every chunk fits Discord's limit and has balanced code fences, for any input."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.discord_front.render import LIMIT, split_reply

# Pieces that make fences, languages, long lines and blank runs likely.
PIECES = st.sampled_from(["```", "```py\n", "```python\n", "`", "``", "\n", "\r\n", " ", "  \n",
                          "a", "print(1)", "é", "x" * 60, "y" * 700, "word "])
TEXTS = st.one_of(
    st.text(),
    st.lists(PIECES, max_size=80).map("".join),
    st.tuples(st.sampled_from(["", "intro\n", "```"]), st.integers(0, 5000),
              st.lists(PIECES, max_size=20)).map(lambda t: t[0] + "```" + "z" * t[1] + "".join(t[2])),
)
DETERMINISTIC = settings(max_examples=400, deadline=None, derandomize=True)


def non_blank(text: str) -> str:
    return "".join(text.split())


def is_subsequence(small: str, big: str) -> bool:
    it = iter(big)
    return all(ch in it for ch in small)


@DETERMINISTIC
@given(TEXTS, st.sampled_from([100, 137, 500, LIMIT]))
def test_every_chunk_fits_and_has_balanced_fences(text, limit):
    chunks = split_reply(text, limit)
    assert chunks
    for chunk in chunks:
        assert len(chunk) <= limit
        assert chunk.count("```") % 2 == 0, chunk
        assert chunk.strip()  # Discord refuses an empty message
    # Nothing is lost: only fences are added and whitespace at cuts trimmed.
    assert is_subsequence(non_blank(text), non_blank("".join(chunks)))


@DETERMINISTIC
@given(st.text(alphabet=st.characters(blacklist_characters="`")), st.sampled_from([100, LIMIT]))
def test_text_without_fences_comes_back_whole(text, limit):
    chunks = split_reply(text, limit)
    if text.strip():
        assert non_blank("".join(chunks)) == non_blank(text)
    else:
        assert chunks == ["(empty reply)"]


def test_a_fence_opening_a_long_line_is_cut_within_the_limit():
    text = "intro\n```" + "x" * 3000 + "\nmore code\n```\nend"
    chunks = split_reply(text)
    assert all(len(c) <= LIMIT and c.count("```") % 2 == 0 for c in chunks)
    assert non_blank("".join(chunks)).replace("`", "") == non_blank(text).replace("`", "")


def test_a_cut_block_is_reopened_with_its_language_and_an_open_one_is_closed():
    code = "\n".join(f"print({i})" for i in range(400))
    chunks = split_reply(f"Look:\n```python\n{code}")
    assert len(chunks) > 1 and all(c.startswith("```python\n") for c in chunks[1:])
    assert chunks[-1].endswith("\n```")
