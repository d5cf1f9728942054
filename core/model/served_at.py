"""Where the live model server answers now, for the processes the bot starts.

A blue/green swap moves the bot's server to a second free port (``serving.swap``), so
``config.base_url`` (the configured port) is where it started, not where it is. The night
runs in its own process and asks the served model (the judge, the gate's open-chat
check): it must find the server the bot moved to. The supervisor that serves writes its
URL to ``<data_dir>/run/served-url`` when it starts and when a swap switches to a new
process; the night reads it. An external server never moves, and a file that is missing
or does not hold a local http URL means the configured one.
"""

from __future__ import annotations

import os
from pathlib import Path

from core.config import Config

FILE = "served-url"


def path(data_dir: Path) -> Path:
    return Path(data_dir) / "run" / FILE


def record(data_dir: Path, url: str) -> None:
    """Write the URL whole (a reader never sees half of it)."""
    target = path(data_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{FILE}.{os.getpid()}")
    part.write_text(url + "\n")
    os.replace(part, target)


def served_url(config: Config) -> str:
    """The URL the bot's server answers at now: the recorded one, else the configured."""
    if config.server.kind == "external":
        return config.base_url
    try:
        url = path(config.data_dir).read_text()[:200].strip()
    except (OSError, UnicodeDecodeError):
        return config.base_url
    host = config.server.host
    local = (f"http://{host}:", f"http://[{host}]:")
    return url if url.startswith(local) and url.endswith("/v1") else config.base_url
