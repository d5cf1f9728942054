"""Media tools: read a PDF's text, look at an image.

Both open the file once, through ``Workspace.open`` (no symlink followed),
and parse exactly those bytes, never in the bot's process: pypdf and Pillow
run in a worker process under memory, CPU and time limits
(``tools.worker``). A PDF made to loop or a decompression bomb (a 300 KB ICO
that decodes a 324 MB PNG when merely opened) ends there with a clear error.
The PDF worker reads the descriptor the bot opened; the image worker gets the
bytes the bot caches, and Pillow's pixel limit is this module's, with its
warning made an error, so an oversized image is refused before it is decoded.
The parsing itself is in ``tools.parsers``.

Images for training: every image the agent views is first copied into a
content-addressed cache outside the workspace (``ctx.services.image_cache``,
``tools.image_cache``: named ``<sha256><ext>``, read-only, never overwritten,
bounded in size with the least recently viewed going first), and the result's
``meta["image"]`` records the hash and cache path: the exact pixels the agent
saw, even if the workspace file was edited or deleted since. Whether the model
can see the image is ``ctx.services.vision``: with vision the agent attaches
the cached image to the conversation; without it, the tool describes the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tools import ToolContext, ToolError, ToolResult, tool, worker
from tools.image_cache import ImageCache
from tools.programs import sandbox_of
from tools.sizes import human_size

MAX_PDF_PAGES = 10
MAX_PDF_BYTES = 100 * 2**20
MAX_PDF_CHARS = 12_000  # per call, under the registry's 16,000-character cap
MAX_IMAGE_BYTES = 50 * 2**20
MAX_IMAGE_PIXELS = 50_000_000

PDF_LIMITS = worker.Limits(memory_mb=1024, cpu_s=20, timeout_s=30)
IMAGE_LIMITS = worker.Limits(memory_mb=1024, cpu_s=10, timeout_s=15)

_EXTENSIONS = {"JPEG": ".jpg", "TIFF": ".tiff", "JPEG2000": ".jp2"}


def open_workspace_file(ctx: ToolContext, path: str, limit: int, what: str) -> int:
    """A descriptor of a regular file of at most ``limit`` bytes, opened without following
    links; ToolError when it is not one. The caller closes it."""
    target = ctx.workspace.resolve(path)
    if not target.exists():
        raise ToolError(f"{path} does not exist; list_dir shows what is there")
    if target.is_dir():
        raise ToolError(f"{path} is a folder, not {what}")
    fd = ctx.workspace.open(path)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{path} is not a regular file")
        if info.st_size > limit:
            raise ToolError(f"{path} is {human_size(info.st_size)}; the limit for {what} is "
                            f"{human_size(limit)}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_workspace_file(ctx: ToolContext, path: str, limit: int, what: str) -> bytes:
    """A regular file's bytes, opened without following links; ToolError when it is not one."""
    with os.fdopen(open_workspace_file(ctx, path, limit, what), "rb") as f:
        return f.read(limit + 1)[:limit]


# --- PDF ---


@tool
def read_pdf(ctx: ToolContext, path: str, start_page: int = 1, pages: int = MAX_PDF_PAGES) -> str:
    """Read the text of a PDF file, at most 10 pages per call, with page markers.

    Args:
        path: The PDF file, relative to your workspace.
        start_page: The first page to read (1 = the first page).
        pages: How many pages to read, 1 to 10.
    """
    if start_page < 1:
        raise ToolError(f"start_page must be 1 or more (pages are numbered from 1), got {start_page}")
    if not 1 <= pages <= MAX_PDF_PAGES:
        raise ToolError(f"pages must be between 1 and {MAX_PDF_PAGES}, got {pages}")
    fd = open_workspace_file(ctx, path, MAX_PDF_BYTES, "a PDF")
    try:
        args = {"path": path, "start_page": start_page, "pages": pages, "fd": fd,
                "max_chars": MAX_PDF_CHARS, "max_bytes": MAX_PDF_BYTES}
        return worker.run("pdf", args, fds=(fd,), limits=PDF_LIMITS, box=sandbox_of(ctx),
                          what=f"reading {path}",
                          hint="the PDF may be damaged or made to stall readers; try fewer pages")
    finally:
        os.close(fd)


# --- images ---


def _cache(ctx: ToolContext) -> ImageCache:
    """The bot's bounded cache, or an unbounded one over a plain folder (tests, tools)."""
    configured = ctx.services.image_cache
    if configured is None:
        raise ToolError("viewing images is not enabled in this bot (no image cache is configured)")
    cache = (configured if isinstance(configured, ImageCache)
             else ImageCache(Path(configured), disk=ctx.services.disk))
    cache_dir = cache.folder.resolve()
    root = ctx.workspace.root
    if cache_dir == root or root in cache_dir.parents:
        # The agent could rewrite cached images, and training would learn from forgeries.
        raise RuntimeError(f"the image cache {cache_dir} lies inside a workspace; move it out")
    return cache


def _describe(facts: dict, path: str, size: int) -> str:
    animated = f", {facts['frames']} frames" if facts["frames"] > 1 else ""
    return (f"{path}: {facts['format']} image, {facts['width']}x{facts['height']} pixels, mode "
            f"{facts['mode']}{animated}, {human_size(size)}. You cannot see images (this model "
            "has no vision), so this is all view_image can tell; a program (python) can analyse "
            "the pixels")


@tool
def view_image(ctx: ToolContext, path: str) -> ToolResult:
    """Look at an image file (PNG, JPEG, GIF, WebP, ...). If you can see images, it is attached
    for you to view; otherwise you get its size, format and colour mode.

    Args:
        path: The image file, relative to your workspace.
    """
    cache = _cache(ctx)
    data = read_workspace_file(ctx, path, MAX_IMAGE_BYTES, "an image")
    facts = worker.run("image", {"path": path, "max_pixels": MAX_IMAGE_PIXELS}, data,
                       limits=IMAGE_LIMITS, box=sandbox_of(ctx), what=f"opening {path}",
                       hint="scale the image down or save it as a plain PNG first")
    kind = facts["format"]
    extension = _EXTENSIONS.get(kind, f".{(kind or 'img').lower()}")
    digest, cached = cache.put(data, extension)
    width, height = facts["width"], facts["height"]
    meta = {"image": {"sha256": digest, "cache_path": str(cached), "mime": facts["mime"],
                      "width": width, "height": height,
                      "path": ctx.workspace.relative(ctx.workspace.resolve(path)),
                      "bytes": len(data)}}
    if ctx.services.vision:
        text = (f"{path} ({kind}, {width}x{height} pixels, {human_size(len(data))}) is "
                "attached for you to view")
    else:
        text = _describe(facts, path, len(data))
    return ToolResult(True, text, meta)
