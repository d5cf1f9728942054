"""Hostile inputs for the tools that parse the agent's files, built by hand, and a loop-lag probe.

Shared by tests/test_tools_hostile.py and bench/hostile.py.
"""

from __future__ import annotations

import asyncio
import functools
import struct
import time
import zlib
from collections.abc import Awaitable
from typing import Any

# A pattern that backtracks exponentially on "a" * n + "b": each extra "a" doubles the work.
CATASTROPHIC_PATTERN = "(a+)+$"


def catastrophic_line(n: int = 28) -> str:
    return "a" * n + "b\n"


def stalling_pdf(pages: int = 10, operators: int = 1_000_000) -> bytes:
    """A PDF made to stall readers: each page's ~10 KB stream inflates to ``operators`` text
    operators (7 MB for a million), which pypdf parses in pure Python, seconds per page."""
    content = b"BT /F1 12 Tf 10 10 Td " + b"(a) Tj " * operators + b"ET"
    stream = zlib.compress(content, 9)
    font = 3 + 2 * pages
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % (3 + 2 * i) for i in range(pages))
               + b"] /Count %d >>" % pages]
    for i in range(pages):
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] /Contents %d 0 R "
                       b"/Resources << /Font << /F1 %d 0 R >> >> >>" % (4 + 2 * i, font))
        objects.append(b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream
                       + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def _png(width: int, height: int) -> bytes:
    """An RGBA PNG of zeros: tiny compressed, ``width * height * 4`` bytes decoded."""
    row = b"\0" * (1 + width * 4)
    packer = zlib.compressobj(9)
    body = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


@functools.lru_cache(maxsize=2)  # 324 MB to compress: once per process
def ico_bomb(side: int = 9000) -> bytes:
    """A decompression bomb: an ICO whose one icon is a ``side`` x ``side`` PNG. Pillow decodes
    an ICO's icon when it merely opens the file: 9000 x 9000 is 324 MB from a 315 KB file."""
    png = _png(side, side)
    directory = struct.pack("<BBBBHHII", 0, 0, 0, 0, 1, 32, len(png), 6 + 16)
    return struct.pack("<HHH", 0, 1, 1) + directory + png


async def with_loop_lag(work: Awaitable[Any], tick_s: float = 0.01) -> tuple[Any, float]:
    """(the result of ``work``, the longest the event loop was late while it ran, in seconds)."""
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(tick_s)
            now = time.perf_counter()
            lags.append(now - last - tick_s)
            last = now

    probe = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    try:
        result = await work
    finally:
        done.set()
        await probe
    return result, max(lags, default=0.0)
