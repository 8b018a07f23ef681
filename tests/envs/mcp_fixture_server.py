"""A small stdio MCP server for the tests: newline-delimited JSON-RPC 2.0, standard library only.

It speaks the protocol the official SDK client speaks (``initialize``, ``tools/list``,
``tools/call``, ``ping``) and starts in milliseconds, so a test can play hundreds of episodes,
each with its own server process. Its tools misbehave on request:

- ``echo(text)``, ``add(a, b)``: answer; ``pid()``: this process's id; ``count()``: calls so far
  in this process (tells a fresh server from a reused one);
- ``fail(message)``: an ``isError`` result; ``image()``: an image block (not text);
- ``hang()``: never answers; ``die()``: exits at once, mid-call;
- ``weather.now()``: a name OpenAI's tool-name rule refuses.

``--fail-start`` exits before reading anything (after a line on stderr); ``--slow-start S``
waits S seconds before answering ``initialize``; ``--die-once PATH`` makes the first
``tools/call`` of all servers started with it exit mid-call (it creates PATH; later calls answer).
"""

from __future__ import annotations

import json
import os
import sys
import time

TOOLS = [
    {"name": "echo", "description": "Echo the text back.",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
    {"name": "add", "description": "Add two integers.",
     "inputSchema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                     "required": ["a", "b"]}},
    {"name": "pid", "description": "The server's process id.", "inputSchema": {"type": "object"}},
    {"name": "count", "description": "Calls of count so far in this server.", "inputSchema": {"type": "object"}},
    {"name": "fail", "description": "Answer an error result.",
     "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}}},
    {"name": "image", "description": "Answer an image.", "inputSchema": {"type": "object"}},
    {"name": "hang", "description": "Never answer.", "inputSchema": {"type": "object"}},
    {"name": "die", "description": "Exit mid-call.", "inputSchema": {"type": "object"}},
    {"name": "weather.now", "description": "Today's weather.", "inputSchema": {"type": "object"}},
]  # fmt: skip


def text(value: object, is_error: bool = False) -> dict[str, object]:
    return {"content": [{"type": "text", "text": str(value)}], "isError": is_error}


def call(name: str, args: dict[str, object], state: dict[str, int]) -> dict[str, object]:
    if name == "echo":
        return text(args["text"])
    if name == "add":
        a, b = args["a"], args["b"]
        if not isinstance(a, int) or not isinstance(b, int):
            return text(f"a and b must be integers, got {a!r} and {b!r}", is_error=True)
        return text(a + b)
    if name == "pid":
        return text(os.getpid())
    if name == "count":
        state["count"] += 1
        return text(state["count"])
    if name == "fail":
        return text(args.get("message", "failed on purpose"), is_error=True)
    if name == "image":
        return {"content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}]}
    if name == "hang":
        time.sleep(3600)
    if name == "die":
        print("fixture server: dying on purpose", file=sys.stderr, flush=True)
        os._exit(3)
    if name == "weather.now":
        return text("sunny")
    raise KeyError(name)


def main() -> None:
    if "--fail-start" in sys.argv:
        print("fixture server: refusing to start (--fail-start)", file=sys.stderr, flush=True)
        sys.exit(2)
    if "--slow-start" in sys.argv:
        time.sleep(float(sys.argv[sys.argv.index("--slow-start") + 1]))
    state = {"count": 0}
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if "id" not in msg:  # a notification (initialized, cancelled): nothing to answer
            continue
        method, params = msg.get("method"), msg.get("params") or {}
        reply: dict[str, object] = {"jsonrpc": "2.0", "id": msg["id"]}
        if method == "initialize":
            reply["result"] = {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "agentrl-fixture", "version": "1"},
            }
        elif method == "tools/list":
            reply["result"] = {"tools": TOOLS}
        elif method == "ping":
            reply["result"] = {}
        elif method == "tools/call":
            if "--die-once" in sys.argv:
                marker = sys.argv[sys.argv.index("--die-once") + 1]
                try:  # atomic: of several servers started at once, exactly one dies
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    pass
                else:
                    os._exit(3)
            try:
                reply["result"] = call(params["name"], params.get("arguments") or {}, state)
            except KeyError as e:
                reply["error"] = {"code": -32602, "message": f"unknown tool or argument {e}"}
        else:
            reply["error"] = {"code": -32601, "message": f"method not found: {method}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
