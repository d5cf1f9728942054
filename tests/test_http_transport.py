"""bot.serving.http against raw asyncio servers that frame their answers as told."""

from __future__ import annotations

import asyncio

import pytest

from bot.serving.http import MAX_BODY, HTTPClient, TransportError

HEADERS = {"Content-Type": "application/json"}


class RawServer:
    """Reads HTTP requests; ``answer(n, body)`` returns the raw bytes to send for the
    n-th request (0-based), or None to close the connection without answering."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                body = await reader.readexactly(length)
                self.requests.append(body)
                raw = self.answer(len(self.requests) - 1, body)
                if raw is None:
                    break
                if isinstance(raw, float):  # hold the request this long, then drop it
                    await asyncio.sleep(raw)
                    break
                writer.write(raw)
                await writer.drain()
                if b"connection: close" in raw.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def framed(body: bytes, *extra: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in extra)
    return (f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{head}\r\n").encode() + body


async def test_keep_alive_reuses_one_connection_for_sequential_requests():
    async with RawServer(lambda n, body: framed(b"answer " + body)) as server:
        client = HTTPClient(timeout_s=5)
        try:
            for i in range(3):
                assert await client.post(server.url, b"q%d" % i, HEADERS) == (200, b"answer q%d" % i)
        finally:
            await client.close()
    assert server.connections == 1 and server.requests == [b"q0", b"q1", b"q2"]


async def test_a_chunked_answer_is_joined_and_the_connection_kept():
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n")
    async with RawServer(lambda n, body: chunked) as server:
        client = HTTPClient(timeout_s=5)
        try:
            assert await client.post(server.url, b"{}", HEADERS) == (200, b"hello, world")
            assert await client.post(server.url, b"{}", HEADERS) == (200, b"hello, world")
        finally:
            await client.close()
    assert server.connections == 1


async def test_connection_close_is_honoured_and_an_error_status_returned():
    answer = lambda n, body: (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n"  # noqa: E731
                              b"Connection: close\r\n\r\nbusy")
    async with RawServer(answer) as server:
        client = HTTPClient(timeout_s=5)
        try:
            assert await client.post(server.url, b"a", HEADERS) == (503, b"busy")
            assert await client.post(server.url, b"b", HEADERS) == (503, b"busy")
        finally:
            await client.close()
    assert server.connections == 2


async def test_an_idle_connection_the_server_closed_is_replaced_and_the_request_sent_once():
    # The first connection answers once and is then closed by the server while idle (as
    # uvicorn does after its keep-alive timeout): the next request goes on a fresh one.
    def answer(n, body):
        return framed(b"ok", "Connection: keep-alive") if n != 1 else None

    async with RawServer(answer) as server:
        client = HTTPClient(timeout_s=5)
        try:
            assert await client.post(server.url, b"first", HEADERS) == (200, b"ok")
            # The server drops the next request unanswered on the reused connection...
            assert await client.post(server.url, b"second", HEADERS) == (200, b"ok")
        finally:
            await client.close()
    # ...which is sent once more on a new connection: it was never answered.
    assert server.requests == [b"first", b"second", b"second"] and server.connections == 2


async def test_an_answer_cut_mid_body_is_an_error_and_never_sent_again():
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\npartial"
    async with RawServer(lambda n, body: cut) as server:
        client = HTTPClient(timeout_s=5)
        try:
            with pytest.raises(TransportError, match="could not be read"):
                await client.post(server.url, b"x", HEADERS)
        finally:
            await client.close()
    assert server.requests == [b"x"]


async def test_a_fresh_connection_closed_without_an_answer_is_an_error():
    async with RawServer(lambda n, body: None) as server:
        client = HTTPClient(timeout_s=5)
        try:
            with pytest.raises(TransportError, match="without answering"):
                await client.post(server.url, b"x", HEADERS)
        finally:
            await client.close()
    assert server.requests == [b"x"]


async def test_the_deadline_covers_the_whole_request_and_the_connection_is_dropped():
    answers = [2.0, framed(b"late ok")]
    async with RawServer(lambda n, body: answers[n]) as server:
        client = HTTPClient(timeout_s=0.3)
        try:
            with pytest.raises(TimeoutError):
                await client.post(server.url, b"slow", HEADERS)
            assert await client.post(server.url, b"next", HEADERS) == (200, b"late ok")
        finally:
            await client.close()
    assert server.connections == 2


async def test_oversized_or_malformed_answers_are_refused():
    answers = [f"HTTP/1.1 200 OK\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n".encode(),
               b"SPDY/3 200 OK\r\n\r\n",
               b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
               b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]
    async with RawServer(lambda n, body: answers[n]) as server:
        for match in ("Content-Length", "not an HTTP/1.x", "malformed header", "chunk size"):
            client = HTTPClient(timeout_s=5)
            try:
                with pytest.raises(TransportError, match=match):
                    await client.post(server.url, b"x", HEADERS)
            finally:
                await client.close()


async def test_refused_connections_and_other_schemes_are_transport_errors(free_port):
    client = HTTPClient(timeout_s=5)
    try:
        with pytest.raises(TransportError, match="cannot connect"):
            await client.post(f"http://127.0.0.1:{free_port}/v1", b"x", HEADERS)
        with pytest.raises(TransportError, match="only http://"):
            await client.post("https://127.0.0.1/v1", b"x", HEADERS)
    finally:
        await client.close()
