"""Byte counts as people read them, in binary units (the limits are powers of two)."""

from __future__ import annotations


def human_size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 2**20:
        return f"{n / 1024:.1f} KiB"
    if n < 2**30:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**30:.1f} GiB"
