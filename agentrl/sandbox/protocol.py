"""The executor's protocol as the host speaks it: a run's input checked and encoded, a reply checked.

A request is one line of JSON (:func:`wire`); :func:`validate_run` builds it from a ``run``
call, refusing bad input before any byte crosses the boundary (sizes counted in bytes, as the
executor receives them). :func:`parse_reply` turns the executor's reply line into an
:class:`~agentrl.sandbox.types.ExecResult`, every field checked for type and bound: the
executor runs next to the model's code, so nothing in a reply is trusted. A reply that fails a
check raises ``TypeError``/``ValueError``/``KeyError``/``binascii.Error``, which
:class:`~agentrl.sandbox.base.Sandbox` catches and judges like a broken channel.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from agentrl.sandbox.errors import SandboxInputError
from agentrl.sandbox.types import STOP_REASONS, ExecResult, Limits

__all__ = ["ERROR_MAX", "EXEC_REASONS", "parse_reply", "validate_run", "wire"]

EXEC_REASONS = frozenset(STOP_REASONS) - {"sandbox_lost", "crashed"}
"""Stop reasons the executor may report; ``crashed`` and ``sandbox_lost`` are the host's alone."""
_EXC_NAME_MAX = 200
ERROR_MAX = 300
"""Characters of an error text from inside the sandbox kept in a message."""


def _text_field(value: Any, what: str, *, allow_empty: bool = False) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SandboxInputError(
                f"{what} is not UTF-8 text (bad byte 0x{raw[e.start]:02x} at offset {e.start}); pass source "
                "text, or put binary data in files= and read it from the code"
            ) from None
    if not isinstance(value, str):
        raise SandboxInputError(f"{what} must be a str, got {type(value).__name__}")
    if "\x00" in value:
        raise SandboxInputError(
            f"{what} contains a NUL byte at offset {value.index(chr(0))}; source code and shell commands "
            "cannot contain NUL (binary data belongs in files=)"
        )
    if not allow_empty and not value.strip():
        raise SandboxInputError(
            f"{what} is empty; pass the Python source or shell command to run, e.g. 'print(1)'"
        )
    return value


def _check_rel_path(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise SandboxInputError(f"file name must be a non-empty str, got {name!r}")
    parts = name.split("/")
    if name.startswith("/") or "\x00" in name or any(p in ("", ".", "..") for p in parts):
        raise SandboxInputError(
            f"file name {name!r} must be a relative path inside the work dir, without '..', '.' or '//' "
            "(e.g. 'data/input.txt')"
        )
    return name


def wire(req: dict[str, Any]) -> bytes:
    """One request as it crosses the boundary: a line of JSON in UTF-8."""
    return json.dumps(req, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def validate_run(
    limits: Limits,
    code: Any,
    cmd: Any,
    files: Mapping[str, str | bytes] | None,
    stdin: Any,
    timeout: float | None,
    return_files: Iterable[str],
    persistent: bool,
) -> dict[str, Any]:
    """Check a ``run`` call and build the executor request; raises SandboxInputError naming the fix."""
    if (code is None) == (cmd is None):
        raise SandboxInputError("pass exactly one of code= (Python source) or cmd= (a shell command)")
    if persistent and cmd is not None:
        raise SandboxInputError(
            "persistent=True keeps a Python interpreter alive; it applies to code=, not cmd="
        )
    req: dict[str, Any] = {"op": "run", "persistent": bool(persistent)}
    if code is not None:
        req["code"] = _text_field(code, "code")
    else:
        req["cmd"] = _text_field(cmd, "cmd")
    req["stdin"] = _text_field(stdin if stdin is not None else "", "stdin", allow_empty=True)
    enc: dict[str, str] = {}
    for name, content in (files or {}).items():
        _check_rel_path(name)
        if isinstance(content, str):
            data = content.encode("utf-8")
        elif isinstance(content, (bytes, bytearray, memoryview)):
            data = bytes(content)
        else:
            raise SandboxInputError(f"files[{name!r}] must be str or bytes, got {type(content).__name__}")
        enc[name] = base64.b64encode(data).decode("ascii")
    req["files"] = enc
    # Counted as the executor receives it: UTF-8 bytes after JSON escaping and base64.
    total = len(wire(req))
    if total > limits.max_input_bytes:
        raise SandboxInputError(
            f"input is {total} bytes as sent to the sandbox (code + stdin + base64 files, UTF-8 and "
            f"JSON-escaped), over the limit of {limits.max_input_bytes}; send less, or raise "
            "Limits(max_input=...)"
        )
    req["return_files"] = [_check_rel_path(n) for n in return_files]
    if timeout is None:
        timeout = limits.timeout
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise SandboxInputError(f"timeout must be a positive number of seconds, got {timeout!r}")
    req["timeout"] = float(timeout)
    req["cpu_time"] = float(limits.cpu_time if limits.cpu_time is not None else timeout)
    req["memory"] = limits.memory_bytes
    req["max_output"] = limits.max_output_bytes
    req["max_file_size"] = limits.max_file_size_bytes
    return req


def _b64_capped(value: Any, cap: int, what: str) -> bytes:
    if not isinstance(value, str) or len(value) > 4 * cap // 3 + 8:
        raise ValueError(f"{what} is not base64 text within the cap")
    data = base64.b64decode(value, validate=True)
    if len(data) > cap:
        raise ValueError(f"{what} is {len(data)} bytes, over the cap of {cap}")
    return data


def _int_or_none(value: Any, lo: int, hi: int, what: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not lo <= value <= hi:
        raise TypeError(f"{what} must be an int in [{lo}, {hi}] or null, got {value!r:.50}")
    return value


def _seconds(value: Any, what: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise TypeError(f"{what} must be non-negative seconds, got {value!r:.50}")
    return float(value)


def parse_reply(r: dict[str, Any], req: dict[str, Any], cap: int, backend: str) -> ExecResult:
    reason = r["reason"]
    if reason not in EXEC_REASONS:
        raise ValueError(f"unknown stop reason {reason!r:.50}")
    exc = r.get("exc")
    if exc is not None and not (
        isinstance(exc, str) and len(exc) <= _EXC_NAME_MAX and all(p.isidentifier() for p in exc.split("."))
    ):
        raise ValueError(f"exception must be a type name, got {exc!r:.50}")
    files: dict[str, bytes] = {}
    file_errors: dict[str, str] = {}
    truncated_files: list[str] = []
    raw_files = r.get("files") or {}
    if not isinstance(raw_files, dict) or not set(raw_files) <= set(req.get("return_files") or ()):
        raise ValueError("files must answer the requested return_files")
    for name, item in raw_files.items():
        if not isinstance(item, dict):
            raise TypeError(f"files[{name!r}] must be an object")
        if "error" in item:
            if not isinstance(item["error"], str):
                raise TypeError(f"files[{name!r}].error must be a str")
            file_errors[name] = item["error"][:ERROR_MAX]
            continue
        files[name] = _b64_capped(item["data"], cap, f"files[{name!r}]")
        if item.get("truncated") is True:
            truncated_files.append(name)
    flags = {k: r.get(k, False) for k in ("stdout_truncated", "stderr_truncated", "session_ended")}
    if not all(type(v) is bool for v in flags.values()):
        raise TypeError(f"flags must be booleans, got {flags!r:.100}")
    return ExecResult(
        reason=reason,
        exit_code=_int_or_none(r.get("exit_code"), 0, 255, "exit_code"),
        signal=_int_or_none(r.get("signal"), 1, 128, "signal"),
        stdout=_b64_capped(r["stdout_b64"], cap, "stdout").decode("utf-8", "replace"),
        stderr=_b64_capped(r["stderr_b64"], cap, "stderr").decode("utf-8", "replace"),
        stdout_truncated=flags["stdout_truncated"],
        stderr_truncated=flags["stderr_truncated"],
        wall_time=_seconds(r.get("wall_time", 0.0), "wall_time"),
        cpu_time=_seconds(r.get("cpu_time", 0.0), "cpu_time"),
        exception=exc.rsplit(".", 1)[-1] if exc else None,
        files=files,
        file_errors=file_errors,
        truncated_files=truncated_files,
        session_ended=flags["session_ended"],
        backend=backend,
    )
