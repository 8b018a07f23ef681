"""A minimal keep-alive HTTP/1.1 JSON client on asyncio streams, for many concurrent connections.

httpx's connection pool slows down sharply with hundreds of concurrent connections
(seconds per request at 256), which would measure the client, not the server.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any


class RawConnection:
    """One TCP connection to ``127.0.0.1:port``; requests on it are sequential."""

    def __init__(self, port: int, timeout: float = 120.0) -> None:
        self.port = port
        self.timeout = timeout
        self._r: asyncio.StreamReader | None = None
        self._w: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> RawConnection:
        self._r, self._w = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", self.port), self.timeout
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._w is not None:
            self._w.close()

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return await asyncio.wait_for(self._request(method, path, body), self.timeout)

    async def _request(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        assert self._r is not None and self._w is not None
        data = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        self._w.write(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
        await self._w.drain()
        status_line = await self._r.readuntil(b"\r\n")
        status = int(status_line.split()[1])
        length = 0
        while (line := await self._r.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.decode().partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        payload = await self._r.readexactly(length)
        return status, json.loads(payload) if payload else None
