"""serving.http against raw asyncio servers that frame their answers as told."""

from __future__ import annotations

import asyncio

import pytest

from serving import http
from serving.http import MAX_BODY, HTTPClient, TransportError

HEADERS = {"Content-Type": "application/json"}


HOLD = object()  # an answer: keep the request unanswered until the server stops


class RawServer:
    """Reads HTTP requests; ``answer(n, body)`` returns the raw bytes to send for the
    n-th request (0-based), None to close the connection without answering, or HOLD.
    After an answer with ``Connection: close`` it closes the connection, unless
    ``honour_close`` is False; with ``close_after`` it closes every connection after
    its answer, as a server whose keep-alive timeout passed."""

    def __init__(self, answer, honour_close: bool = True, close_after: bool = False) -> None:
        self.answer = answer
        self.honour_close, self.close_after = honour_close, close_after
        self.release = asyncio.Event()
        self.requests: list[bytes] = []
        self.connections = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        self._server.close()
        for writer in self._writers:  # the client may still pool them (3.12 waits for them)
            writer.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
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
                if raw is HOLD:
                    await self.release.wait()
                    break
                writer.write(raw)
                await writer.drain()
                if self.close_after or (self.honour_close and b"connection: close" in raw.lower()):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def client():
    http_client = HTTPClient(timeout_s=5)
    yield http_client
    await http_client.close()


def framed(body: bytes, *extra: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in extra)
    return (f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{head}\r\n").encode() + body


async def test_keep_alive_reuses_one_connection_for_sequential_requests(client):
    async with RawServer(lambda n, body: framed(b"answer " + body)) as server:
        for i in range(3):
            assert await client.post(server.url, b"q%d" % i, HEADERS) == (200, b"answer q%d" % i)
    assert server.connections == 1 and server.requests == [b"q0", b"q1", b"q2"]


async def test_a_chunked_answer_is_joined_and_the_connection_kept(client):
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n")
    async with RawServer(lambda n, body: chunked) as server:
        assert await client.post(server.url, b"{}", HEADERS) == (200, b"hello, world")
        assert await client.post(server.url, b"{}", HEADERS) == (200, b"hello, world")
    assert server.connections == 1


async def test_connection_close_is_honoured_and_an_error_status_returned(client):
    answer = lambda n, body: (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n"  # noqa: E731
                              b"Connection: close\r\n\r\nbusy")
    async with RawServer(answer, honour_close=False) as server:  # it would serve another
        assert await client.post(server.url, b"a", HEADERS) == (503, b"busy")
        assert await client.post(server.url, b"b", HEADERS) == (503, b"busy")
    assert server.connections == 2


async def test_a_pooled_connection_dropped_without_an_answer_is_sent_once_more_on_a_fresh_one(client):
    # The second request, on the pooled connection, is read and dropped unanswered (as a
    # server that closed the connection, or died, would): it goes once more on a new one.
    async with RawServer(lambda n, body: framed(b"ok") if n != 1 else None) as server:
        assert await client.post(server.url, b"first", HEADERS) == (200, b"ok")
        assert await client.post(server.url, b"second", HEADERS) == (200, b"ok")
    assert server.requests == [b"first", b"second", b"second"] and server.connections == 2


async def test_a_request_is_sent_at_most_twice_however_many_pooled_connections_drop_it(client):
    async with RawServer(lambda n, body: None if body == b"x" else framed(b"ok")) as server:
        await asyncio.gather(*(client.post(server.url, b"warm", HEADERS) for _ in range(3)))
        assert server.connections == 3  # three pooled connections
        # Dropped on a pooled one, then on the fresh one: given up, not sent a third time.
        with pytest.raises(TransportError, match="without answering"):
            await client.post(server.url, b"x", HEADERS)
    assert server.requests.count(b"x") == 2 and server.connections == 4


async def test_a_connection_the_server_closed_while_idle_is_replaced_before_sending(client):
    # As uvicorn's keep-alive timeout does: the answer, then the server closes the
    # connection. Seen closed, it is not used: the next request is sent once, on a new one.
    async with RawServer(lambda n, body: framed(b"ok"), close_after=True) as server:
        assert await client.post(server.url, b"first", HEADERS) == (200, b"ok")
        (reader, _), _ = client._idle[("127.0.0.1", server.port)][0]  # noqa: SLF001
        while not reader.at_eof():
            await asyncio.sleep(0.01)
        assert await client.post(server.url, b"second", HEADERS) == (200, b"ok")
    assert server.requests == [b"first", b"second"] and server.connections == 2


async def test_a_connection_idle_past_the_limit_is_closed_not_reused(client, monkeypatch):
    monkeypatch.setattr(http, "IDLE_S", 0.05)
    async with RawServer(lambda n, body: framed(b"ok")) as server:
        await client.post(server.url, b"a", HEADERS)
        await asyncio.sleep(0.1)
        await client.post(server.url, b"b", HEADERS)
    assert server.requests == [b"a", b"b"] and server.connections == 2


async def test_an_answer_cut_mid_body_is_an_error_and_never_sent_again(client):
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\npartial"
    async with RawServer(lambda n, body: framed(b"ok") if n == 0 else cut) as server:
        await client.post(server.url, b"warm", HEADERS)  # the next goes on a reused one
        with pytest.raises(TransportError, match="could not be read"):
            await client.post(server.url, b"x", HEADERS)
    assert server.requests == [b"warm", b"x"]


async def test_a_fresh_connection_closed_without_an_answer_is_an_error(client):
    async with RawServer(lambda n, body: None) as server:
        with pytest.raises(TransportError, match="without answering"):
            await client.post(server.url, b"x", HEADERS)
    assert server.requests == [b"x"]


async def test_the_deadline_covers_the_whole_request_and_the_connection_is_dropped(client):
    answers = [HOLD, framed(b"ok")]
    async with RawServer(lambda n, body: answers[n]) as server:
        client.timeout_s = 0.3
        with pytest.raises(TimeoutError, match="no answer from 127.0.0.1"):
            await client.post(server.url, b"slow", HEADERS)
        client.timeout_s = 10
        assert await client.post(server.url, b"next", HEADERS) == (200, b"ok")
    assert server.connections == 2


async def test_a_cancelled_request_does_not_return_its_connection_to_the_pool(client):
    answers = [HOLD, framed(b"ok")]
    async with RawServer(lambda n, body: answers[n]) as server:
        client.timeout_s = 10
        task = asyncio.create_task(client.post(server.url, b"slow", HEADERS))
        while not server.requests:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await client.post(server.url, b"next", HEADERS) == (200, b"ok")
    assert server.connections == 2


async def test_interim_no_body_and_unframed_answers(client):
    answers = [b"HTTP/1.1 100 Continue\r\n\r\n" + framed(b"after interim"),
               b"HTTP/1.1 204 No Content\r\n\r\n",
               b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end"]
    async with RawServer(lambda n, body: answers[n]) as server:
        assert await client.post(server.url, b"a", HEADERS) == (200, b"after interim")
        assert await client.post(server.url, b"b", HEADERS) == (204, b"")
        assert await client.post(server.url, b"c", HEADERS) == (200, b"to the end")
    assert server.connections == 1  # kept after the first two; the unframed one ended it


async def test_oversized_or_malformed_answers_are_refused(client):
    answers = [f"HTTP/1.1 200 OK\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n".encode(),
               b"SPDY/3 200 OK\r\n\r\n",
               b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
               b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
               b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n",
               "HTTP/1.1 200 OK\r\nContent-Length: \u00b2\r\n\r\n".encode("latin-1"),
               "HTTP/1.1 \u00b200 OK\r\n\r\n".encode("latin-1")]
    async with RawServer(lambda n, body: answers[n]) as server:
        for match in ("Content-Length", "not an HTTP/1.x", "malformed header", "chunk size",
                      "chunk size", "Content-Length", "not an HTTP/1.x"):
            with pytest.raises(TransportError, match=match):
                await client.post(server.url, b"x", HEADERS)


async def test_refused_connections_and_other_schemes_are_transport_errors(client, free_port):
    with pytest.raises(TransportError, match="cannot connect"):
        await client.post(f"http://127.0.0.1:{free_port}/v1", b"x", HEADERS)
    with pytest.raises(TransportError, match="only http://"):
        await client.post("https://127.0.0.1/v1", b"x", HEADERS)
    with pytest.raises(TransportError, match="unusable URL"):
        await client.post("http://127.0.0.1:port/v1", b"x", HEADERS)


async def test_idle_connections_to_a_server_no_longer_used_are_closed(client, monkeypatch):
    # A blue/green swap moves to another port: the old port's pooled connections must not
    # stay open until the client closes.
    monkeypatch.setattr(http, "IDLE_S", 0.05)
    async with RawServer(lambda n, body: framed(b"old")) as old, \
            RawServer(lambda n, body: framed(b"new")) as new:
        await client.post(old.url, b"a", HEADERS)
        (_, writer), _ = client._idle[("127.0.0.1", old.port)][0]  # noqa: SLF001
        await asyncio.sleep(0.1)
        assert await client.post(new.url, b"b", HEADERS) == (200, b"new")
        assert writer.is_closing() and ("127.0.0.1", old.port) not in client._idle  # noqa: SLF001
