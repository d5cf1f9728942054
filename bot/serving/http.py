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
- a pooled connection the server closed while idle (uvicorn closes them after
  a few seconds) fails before any answer byte: the request is sent once more on
  a fresh connection, which is safe because the server never read it;
- one deadline for the whole request, and bounds on the head and body sizes.

A connection, protocol or size failure raises ``TransportError``; the deadline
raises ``TimeoutError``. Both are the chat client's to retry. Only ``http://``
is spoken: the server is local, and no proxy from the environment is used.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024  # the status line and headers
MAX_BODY = 64 * 1024 * 1024  # a chat answer is kilobytes; this only stops a runaway


class TransportError(ConnectionError):
    """The request could not be sent or its answer could not be read."""


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class HTTPClient:
    """POSTs to http:// URLs over pooled keep-alive connections."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._closed = False

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """The status and body of the answer to POST ``body`` to ``url``."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise TransportError(f"only http:// URLs are spoken here, not {url!r}")
        host, port = parts.hostname, parts.port or 80
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = (f"POST {target} HTTP/1.1\r\nHost: {host}:{port}\r\n{head}"
                   f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body
        async with asyncio.timeout(self.timeout_s):
            while True:
                conn, reused = await self._connection(host, port)
                try:
                    status, data, keep = await _exchange(conn, request)
                except _Stale:
                    _close(conn)
                    if reused:
                        continue  # closed while idle, before reading this request: send again
                    raise TransportError(f"{host}:{port} closed the connection "
                                         "without answering") from None
                except BaseException:  # a failure or a cancel mid-answer: never reused
                    _close(conn)
                    raise
                if keep and not self._closed:
                    self._idle.setdefault((host, port), []).append(conn)
                else:
                    _close(conn)
                return status, data

    async def _connection(self, host: str, port: int) -> tuple[_Conn, bool]:
        idle = self._idle.get((host, port))
        while idle:
            conn = idle.pop()
            if not conn[0].at_eof() and not conn[1].is_closing():
                return conn, True
            _close(conn)
        try:
            return await asyncio.open_connection(host, port, limit=MAX_HEAD), False
        except OSError as exc:
            raise TransportError(f"cannot connect to {host}:{port}: {exc}") from exc

    async def close(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                _close(conn)
        self._idle.clear()


class _Stale(Exception):
    """The connection ended before the first byte of the answer."""


async def _exchange(conn: _Conn, request: bytes) -> tuple[int, bytes, bool]:
    reader, writer = conn
    answered = False  # once a byte of the answer came, the request is never sent again
    try:
        writer.write(request)
        await writer.drain()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _Stale from None
            raise
        answered = True
        status, headers = _parse_head(head)
        data = await _read_body(reader, headers)
    except TransportError:
        raise
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        if isinstance(exc, ConnectionError) and not answered:
            raise _Stale from None  # reset before any answer: as a clean close
        raise TransportError(f"the answer could not be read: {type(exc).__name__}: {exc}"
                             ) from exc
    keep = (headers.get("connection", "").lower() != "close"
            and ("content-length" in headers or "chunked" in headers.get("transfer-encoding", "")))
    return status, data, keep


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise TransportError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise TransportError(f"a malformed header line: {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
    return int(code), headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks, total = [], 0
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise TransportError(f"a malformed chunk size: {size_line[:40]!r}") from None
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
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit() or int(length) > MAX_BODY:
            raise TransportError(f"an unusable Content-Length: {length[:40]!r}")
        return await reader.readexactly(int(length))
    data = await reader.read(MAX_BODY + 1)  # no framing: the body ends with the connection
    while data and len(data) <= MAX_BODY and not reader.at_eof():
        more = await reader.read(MAX_BODY + 1 - len(data))
        if not more:
            break
        data += more
    if len(data) > MAX_BODY:
        raise TransportError(f"the answer is over {MAX_BODY} bytes")
    return data


def _close(conn: _Conn) -> None:
    conn[1].close()
