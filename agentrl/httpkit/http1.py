"""A lean keep-alive HTTP/1.1 client connection: the fast transport of :class:`~agentrl.httpkit.HTTPClient`.

An episode sends one request at a time, so it needs exactly one connection and no pool. This is
that connection: an ``asyncio.Protocol`` that writes a request in one ``write`` and parses the
answer with ``httptools`` (the C parser the env server already uses), which handles
``Content-Length``, chunked bodies and ``Connection: close``. It costs a small fraction of the CPU
``httpx.AsyncClient`` spends per request (a pool scan per request and an anyio stream layer),
which is what lets one process drive thousands of concurrent episodes.

Contract:

- ``request`` returns ``(status, body, retry_after)`` or raises ``OSError`` (the connection broke
  or could not be made), ``TimeoutError`` (a deadline passed) or ``httptools.HttpParserError``
  (a malformed answer). The caller classifies those; nothing here retries.
- Every call has a deadline: ``connect_timeout`` for the TCP (and TLS) handshake,
  ``read_timeout`` from the request's write to the answer's last byte.
- After a failure, a timeout or a cancellation the connection is dropped (its state is unknown)
  and the next request opens a fresh one; a connection the server closed while idle (keep-alive
  expiry) is noticed and replaced before anything is sent on it.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import cast
from urllib.parse import urlsplit

import httptools

__all__ = ["Http1Connection"]

_SSL: ssl.SSLContext | None = None


def _ssl_context() -> ssl.SSLContext:
    global _SSL
    if _SSL is None:  # built once: creating a context costs ~80 ms
        _SSL = ssl.create_default_context()
    return _SSL


class _Protocol(asyncio.Protocol):
    """One TCP connection; ``answer`` is the future of the request in flight (at most one)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.answer: asyncio.Future[tuple[int, bytes, str]] | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._body: list[bytes] = []
        self._retry_after = ""
        self._header = b""

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(exc or ConnectionResetError("the server closed the connection"))

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self.closed = True
            if self.answer is not None and not self.answer.done():
                self.answer.set_exception(e)
            if self.transport is not None:
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._body, self._retry_after = [], ""

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"retry-after":
            self._retry_after = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if not self._parser.should_keep_alive():
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        if self.answer is not None and not self.answer.done():
            self.answer.set_result((self._parser.get_status_code(), b"".join(self._body), self._retry_after))


class Http1Connection:
    """A lazily opened, reused HTTP/1.1 connection to the origin of ``base_url``.

    ``request(method, path)`` sends to ``base_url``'s path + ``path``. Bound to the event loop
    it first connects on; the owner drops it when the loop changes.
    """

    def __init__(self, base_url: str, *, connect_timeout: float, read_timeout: float) -> None:
        parts = urlsplit(base_url)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/")
        self._head = f"Host: {parts.netloc.rpartition('@')[2]}\r\n".encode("ascii")
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self._proto: _Protocol | None = None
        self._lock = asyncio.Lock()  # one request in flight: HTTP/1.1 answers come back in order

    async def connect(self) -> None:
        """Open the connection unless a live one is kept; a no-op on the hot path."""
        proto = self._proto
        if proto is None or proto.closed or proto.transport is None or proto.transport.is_closing():
            self.close()
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(self.connect_timeout):
                _, proto = await loop.create_connection(
                    _Protocol,
                    self._host,
                    self._port,
                    ssl=_ssl_context() if self._tls else None,
                    server_hostname=self._host if self._tls else None,
                )
            self._proto = proto

    async def request(
        self, method: str, path: str, body: bytes | None, read_timeout: float | None = None
    ) -> tuple[int, bytes, str]:
        """Send one request and wait for its whole answer: ``(status, body, Retry-After or "")``.

        ``read_timeout`` (default: the connection's) bounds this request. Concurrent callers are
        served one after another (an episode normally sends one at a time).
        """
        async with self._lock:
            return await self._request(method, path, body, read_timeout or self.read_timeout)

    async def _request(
        self, method: str, path: str, body: bytes | None, read_timeout: float
    ) -> tuple[int, bytes, str]:
        await self.connect()
        proto = self._proto
        assert proto is not None and proto.transport is not None
        head = f"{method} {self._prefix}{path} HTTP/1.1\r\n".encode() + self._head
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        elif method not in ("GET", "HEAD", "DELETE"):  # a bodiless POST says so, as httpx does
            head += b"Content-Length: 0\r\n"
        proto.answer = asyncio.get_running_loop().create_future()
        done = False
        try:
            proto.transport.write(head + b"\r\n" + (body or b""))
            async with asyncio.timeout(read_timeout):
                answer = await proto.answer
            done = True
            return answer
        finally:
            proto.answer = None
            if not done:  # a timeout, a failure or a cancellation: the connection's state is unknown
                self.close()

    def close(self) -> None:
        """Drop the connection (idempotent); the next request opens a new one."""
        proto, self._proto = self._proto, None
        if proto is not None and proto.transport is not None:
            proto.transport.close()
