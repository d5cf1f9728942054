"""A small HTTP/1.1 client for the local model server: POST a body, read the answer.

The chat client sends one request per model call to a server on this machine,
and aiohttp's request machinery (request and response objects, payload
registry, timers, tracing hooks) was ~25% of the harness's event-loop CPU per
turn. This does only what that traffic needs, over asyncio streams
(bench/agent.py: the loop's CPU per turn 973 -> 745 us, measured in one run):

- keep-alive connections, pooled per (host, port), so a swap to another port
  needs nothing new; a connection is reused only after its answer was read whole;
- an answer framed by ``Content-Length`` or ``Transfer-Encoding: chunked``, or
  read to the end when it has neither; ``Connection: close`` is honoured;
- a connection idle for longer than ``IDLE_S`` is closed, not reused (uvicorn
  closes them after 5 s); one the server closed anyway fails before any byte of
  the answer: the pool for that server is emptied and the request is sent once
  more, on a fresh connection. A server that read the request and then died
  looks the same, so that one resend is the most a request gets: a dead server
  refuses the fresh connection, and a live one answers it;
- one deadline for the whole request, and bounds on the head and body sizes.

A connection, protocol or size failure raises ``TransportError``; the deadline
raises ``TimeoutError``. Both are the chat client's to retry. Only ``http://``
is spoken: the server is local, and no proxy from the environment is used.
"""

from __future__ import annotations

import asyncio
import re
import time
from urllib.parse import urlsplit

IDLE_S = 4.0  # under uvicorn's 5 s keep-alive timeout
MAX_HEAD = 64 * 1024  # the status line and headers
MAX_BODY = 16 * 1024 * 1024  # a chat answer is kilobytes; this only stops a runaway


class TransportError(ConnectionError):
    """The request could not be sent or its answer could not be read."""


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class HTTPClient:
    """POSTs to http:// URLs over pooled keep-alive connections."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._idle: dict[tuple[str, int], list[tuple[_Conn, float]]] = {}  # with idle since
        self._closed = False
        self._swept = time.monotonic()

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """The status and body of the answer to POST ``body`` to ``url``."""
        parts = urlsplit(url)
        try:
            host, port = parts.hostname, parts.port or 80
        except ValueError as exc:  # a port that is no number
            raise TransportError(f"an unusable URL {url!r}: {exc}") from None
        if parts.scheme != "http" or not host:
            raise TransportError(f"only http:// URLs are spoken here, not {url!r}")
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = (f"POST {target} HTTP/1.1\r\nHost: {host}:{port}\r\n{head}"
                   f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body
        resent = False
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    conn, reused = await self._connection(host, port)
                    try:
                        status, data, keep = await _exchange(conn, request)
                    except _Stale:
                        _abort(conn)
                        if reused and not resent:
                            resent = True  # once: the pool is emptied, the next one is fresh
                            for idle, _ in self._idle.pop((host, port), []):
                                _abort(idle)
                            continue
                        raise TransportError(f"{host}:{port} closed the connection "
                                             "without answering") from None
                    except BaseException:  # a failure or a cancel mid-request: never reused
                        _abort(conn)
                        raise
                    if keep and not self._closed:
                        self._idle.setdefault((host, port), []).append((conn, time.monotonic()))
                    else:
                        conn[1].close()
                    return status, data
        except TimeoutError:
            raise TimeoutError(f"no answer from {host}:{port} within {self.timeout_s:g} s"
                               ) from None

    async def _connection(self, host: str, port: int) -> tuple[_Conn, bool]:
        now = time.monotonic()
        if now - self._swept > IDLE_S:
            self._sweep(now)  # every few seconds, not per request: 50 channels pool 50
        idle = self._idle.get((host, port))
        while idle:  # the most recently used first
            conn, since = idle.pop()
            if now - since < IDLE_S and not conn[0].at_eof() and not conn[1].is_closing():
                return conn, True
            conn[1].close()
        try:
            return await asyncio.open_connection(host, port, limit=MAX_HEAD), False
        except OSError as exc:
            raise TransportError(f"cannot connect to {host}:{port}: {exc}") from exc

    def _sweep(self, now: float) -> None:
        """Close the connections idle too long, of every server (a swap's old port too)."""
        self._swept = now
        for key, conns in list(self._idle.items()):
            fresh = []
            for conn, since in conns:
                if now - since < IDLE_S:
                    fresh.append((conn, since))
                else:
                    conn[1].close()
            if fresh:
                self._idle[key] = fresh
            else:
                del self._idle[key]

    async def close(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn, _ in conns:
                conn[1].close()
        self._idle.clear()


class _Stale(Exception):
    """The connection ended before the first byte of the answer."""


async def _exchange(conn: _Conn, request: bytes) -> tuple[int, bytes, bool]:
    reader, writer = conn
    try:
        try:
            writer.write(request)
            await writer.drain()
        except ConnectionError:
            raise _Stale from None  # reset before any answer: as a clean close
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _Stale from None
            raise
        status, version, headers = _parse_head(head)
        while 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            status, version, headers = _parse_head(await reader.readuntil(b"\r\n\r\n"))
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if status in (204, 304):
            data, framed = b"", True
        elif chunked:
            data, framed = await _read_chunked(reader), True
        elif "content-length" in headers:
            data, framed = await _read_length(reader, headers["content-length"]), True
        else:
            data, framed = await _read_to_end(reader), False
    except TransportError:
        raise
    except (OSError, EOFError, asyncio.LimitOverrunError, ValueError) as exc:
        raise TransportError(f"the answer could not be read: {type(exc).__name__}: {exc}"
                             ) from exc
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    keep = framed and ("close" not in tokens) and (version == "HTTP/1.1" or "keep-alive" in tokens)
    return status, data, keep


def _parse_head(head: bytes) -> tuple[int, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if version not in ("HTTP/1.0", "HTTP/1.1") or not _DIGITS.fullmatch(code):
        raise TransportError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise TransportError(f"a malformed header line: {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
    return int(code), version, headers


_DIGITS = re.compile(r"[0-9]{1,19}")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks, total = [], 0
    while True:
        size_line = await reader.readuntil(b"\r\n")
        digits = size_line.split(b";", 1)[0].strip()
        if not _HEX.fullmatch(digits):
            raise TransportError(f"a malformed chunk size: {size_line[:40]!r}")
        size = int(digits, 16)
        total += size
        if total > MAX_BODY:
            raise TransportError(f"the answer is over {MAX_BODY} bytes")
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailers, unused
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise TransportError("a chunk did not end with CRLF")


async def _read_length(reader: asyncio.StreamReader, length: str) -> bytes:
    if not _DIGITS.fullmatch(length) or int(length) > MAX_BODY:
        raise TransportError(f"an unusable Content-Length: {length[:40]!r}")
    return await reader.readexactly(int(length))


async def _read_to_end(reader: asyncio.StreamReader) -> bytes:
    """No framing: the body ends with the connection."""
    data = b""
    while len(data) <= MAX_BODY:
        more = await reader.read(MAX_BODY + 1 - len(data))
        if not more:
            return data
        data += more
    raise TransportError(f"the answer is over {MAX_BODY} bytes")


def _abort(conn: _Conn) -> None:
    # Not close(): that would still flush a half-written request, which the server
    # could then read whole and answer after we gave up on it.
    conn[1].transport.abort()
