"""The MCP server of ``benchmarks/mcp_tools.py``: one ``add`` tool (FastMCP), over stdio or ``--http PORT``."""

from __future__ import annotations

import sys

from mcp.server.fastmcp import FastMCP

server = FastMCP("add", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


if __name__ == "__main__":
    if "--http" in sys.argv:
        server.settings.host, server.settings.port = "127.0.0.1", int(sys.argv[sys.argv.index("--http") + 1])
        server.run(transport="streamable-http")
    else:
        server.run()
