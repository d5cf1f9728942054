"""read_pdf pages through a PDF's text; view_image caches exactly what the agent saw."""

from __future__ import annotations

import hashlib
import io
import os
import stat
from pathlib import Path

import pytest
from PIL import Image

from sandbox.paths import Workspace
from tools import Registry, ToolContext
import tools.media

REGISTRY = Registry()
REGISTRY.register_module(tools.media)


def text_pdf(pages: list[str]) -> bytes:
    """A minimal valid PDF with one line of Helvetica text per page, built by hand."""
    n = len(pages)
    font = 3 + 2 * n
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % (3 + 2 * i) for i in range(n))
               + b"] /Count %d >>" % n]
    for i, text in enumerate(pages):
        stream = b"BT /F1 12 Tf 72 720 Td (" + text.encode("latin-1") + b") Tj ET"
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
                       b"/Resources << /Font << /F1 %d 0 R >> >> /Contents %d 0 R >>" % (font, 4 + 2 * i))
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def png(color: str = "red", size: tuple[int, int] = (32, 16)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "image-cache"


@pytest.fixture
def ctx(tmp_path: Path, cache: Path) -> ToolContext:
    return ToolContext.open("media", Workspace(tmp_path / "ws"), tmp_path / "state", image_cache=cache)


def put(ctx: ToolContext, path: str, data: bytes) -> Path:
    target = ctx.workspace.root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


async def call(ctx: ToolContext, name: str, /, **arguments):
    return await REGISTRY.call(name, arguments, ctx)


# --- read_pdf ---


async def test_read_pdf_shows_text_with_page_markers(ctx):
    put(ctx, "doc.pdf", text_pdf(["Hello first page", "Second page here"]))
    result = await call(ctx, "read_pdf", path="doc.pdf")
    assert result.ok, result.output
    assert "pages 1-2 of 2" in result.output
    assert "--- page 1 ---\nHello first page" in result.output
    assert "--- page 2 ---\nSecond page here" in result.output
    assert "(end of document)" in result.output


async def test_read_pdf_pages_ten_at_a_time_and_says_how_to_continue(ctx):
    put(ctx, "long.pdf", text_pdf([f"Text of page {i}" for i in range(1, 14)]))
    first = await call(ctx, "read_pdf", path="long.pdf")
    assert first.ok, first.output
    assert "pages 1-10 of 13" in first.output
    assert "Text of page 10" in first.output and "Text of page 11" not in first.output
    assert "3 more pages" in first.output and "start_page=11" in first.output
    rest = await call(ctx, "read_pdf", path="long.pdf", start_page=11)
    assert "pages 11-13 of 13" in rest.output and "Text of page 13" in rest.output
    assert "(end of document)" in rest.output
    two = await call(ctx, "read_pdf", path="long.pdf", start_page=4, pages=2)
    assert "pages 4-5 of 13" in two.output and "start_page=6" in two.output


async def test_read_pdf_stops_early_when_pages_are_long_and_continues_from_there(ctx, monkeypatch):
    monkeypatch.setattr(tools.media, "MAX_PDF_CHARS", 40)
    put(ctx, "dense.pdf", text_pdf([f"Page {i} has a fairly long line" for i in range(1, 5)]))
    first = await call(ctx, "read_pdf", path="dense.pdf")
    assert "pages 1-1 of 4" in first.output and "start_page=2" in first.output


async def test_read_pdf_says_when_a_pdf_has_no_pages(ctx):
    put(ctx, "empty.pdf", text_pdf([]))
    result = await call(ctx, "read_pdf", path="empty.pdf")
    assert not result.ok and "without pages" in result.output


async def test_read_pdf_refuses_bad_page_arguments(ctx):
    put(ctx, "doc.pdf", text_pdf(["only page"]))
    too_many = await call(ctx, "read_pdf", path="doc.pdf", pages=11)
    assert not too_many.ok and "between 1 and 10" in too_many.output
    past = await call(ctx, "read_pdf", path="doc.pdf", start_page=5)
    assert not past.ok and "has 1 pages" in past.output
    zero = await call(ctx, "read_pdf", path="doc.pdf", start_page=0)
    assert not zero.ok and "start_page must be 1 or more" in zero.output


async def test_read_pdf_gives_a_clear_error_for_a_corrupt_pdf(ctx):
    put(ctx, "broken.pdf", b"%PDF-1.4\nthis is not really a pdf at all\n")
    result = await call(ctx, "read_pdf", path="broken.pdf")
    assert not result.ok
    assert "could not be read as a PDF" in result.output and "damaged" in result.output


async def test_read_pdf_gives_a_clear_error_for_a_password_protected_pdf(ctx):
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    writer.append(PdfReader(io.BytesIO(text_pdf(["confidential"]))))
    writer.encrypt(user_password="secret", algorithm="RC4-128")
    buffer = io.BytesIO()
    writer.write(buffer)
    put(ctx, "locked.pdf", buffer.getvalue())
    result = await call(ctx, "read_pdf", path="locked.pdf")
    assert not result.ok and "encrypted with a password" in result.output


async def test_read_pdf_refuses_missing_files_folders_and_escapes(ctx):
    missing = await call(ctx, "read_pdf", path="nope.pdf")
    assert not missing.ok and "does not exist" in missing.output
    (ctx.workspace.root / "folder").mkdir()
    folder = await call(ctx, "read_pdf", path="folder")
    assert not folder.ok and "is a folder" in folder.output
    escape = await call(ctx, "read_pdf", path="../outside.pdf")
    assert not escape.ok and "'..' is not allowed" in escape.output


# --- view_image ---


async def test_view_image_caches_the_image_outside_the_workspace_by_hash(ctx, cache):
    data = png()
    put(ctx, "pics/red.png", data)
    result = await call(ctx, "view_image", path="pics/red.png")
    assert result.ok, result.output
    digest = hashlib.sha256(data).hexdigest()
    image = result.meta["image"]
    assert image["sha256"] == digest
    assert (image["mime"], image["width"], image["height"]) == ("image/png", 32, 16)
    cached = Path(image["cache_path"])
    assert cached == cache.resolve() / f"{digest}.png"
    assert cached.read_bytes() == data
    assert ctx.workspace.root not in cached.parents
    assert stat.S_IMODE(cached.stat().st_mode) == 0o444
    assert [p.name for p in cache.iterdir()] == [cached.name]  # no temp files left behind


async def test_cached_image_survives_editing_and_deleting_the_workspace_file(ctx):
    original = png("blue")
    target = put(ctx, "pic.png", original)
    first = await call(ctx, "view_image", path="pic.png")
    cached = Path(first.meta["image"]["cache_path"])
    target.write_bytes(png("green"))
    second = await call(ctx, "view_image", path="pic.png")
    assert second.meta["image"]["sha256"] != first.meta["image"]["sha256"]
    target.unlink()
    assert cached.read_bytes() == original
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == first.meta["image"]["sha256"]


async def test_viewing_the_same_image_twice_never_rewrites_the_cache_entry(ctx):
    put(ctx, "a.png", png())
    put(ctx, "b.png", png())  # same bytes, other name
    first = await call(ctx, "view_image", path="a.png")
    cached = Path(first.meta["image"]["cache_path"])
    inode = cached.stat().st_ino
    second = await call(ctx, "view_image", path="b.png")
    assert second.meta["image"]["cache_path"] == str(cached)
    assert cached.stat().st_ino == inode


async def test_view_image_describes_the_image_when_the_model_has_no_vision(ctx):
    put(ctx, "pic.png", png(size=(40, 30)))
    result = await call(ctx, "view_image", path="pic.png")
    assert "PNG" in result.output and "40x30" in result.output and "mode RGB" in result.output
    assert "no vision" in result.output


async def test_view_image_says_the_image_is_attached_when_the_model_has_vision(tmp_path, cache):
    ctx = ToolContext.open("media", Workspace(tmp_path / "ws"), tmp_path / "state",
                           image_cache=cache, vision=True)
    put(ctx, "pic.png", png())
    result = await call(ctx, "view_image", path="pic.png")
    assert result.ok and "attached for you to view" in result.output
    assert result.meta["image"]["sha256"]


async def test_view_image_refuses_files_that_are_not_images(ctx, cache):
    put(ctx, "notes.txt", b"just some text, not pixels\n")
    result = await call(ctx, "view_image", path="notes.txt")
    assert not result.ok and "not an image" in result.output
    assert not cache.exists() or not any(cache.iterdir())


async def test_view_image_refuses_huge_images(ctx, monkeypatch):
    monkeypatch.setattr(tools.media, "MAX_IMAGE_PIXELS", 100)
    put(ctx, "big.png", png(size=(20, 20)))
    result = await call(ctx, "view_image", path="big.png")
    assert not result.ok and "400 pixels" in result.output and "limit" in result.output


async def test_view_image_refuses_a_damaged_image(ctx):
    data = png(size=(64, 64))
    put(ctx, "cut.png", data[:60] + b"\0" * 40 + data[100:])
    result = await call(ctx, "view_image", path="cut.png")
    assert not result.ok and "damaged" in result.output


async def test_view_image_without_an_image_cache_is_not_enabled(tmp_path):
    ctx = ToolContext.open("media", Workspace(tmp_path / "ws"), tmp_path / "state")
    put(ctx, "pic.png", png())
    result = await call(ctx, "view_image", path="pic.png")
    assert not result.ok and "not enabled" in result.output


async def test_view_image_will_not_follow_a_link_out_of_the_workspace(ctx, tmp_path):
    outside = tmp_path / "host.png"
    outside.write_bytes(png())
    os.symlink(outside, ctx.workspace.root / "link.png")
    result = await call(ctx, "view_image", path="link.png")
    assert not result.ok and "outside the workspace" in result.output
