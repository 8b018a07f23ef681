"""The package's shape holds: modules stay small enough to read (the house rule in CONTRIBUTING.md)."""

from __future__ import annotations

from pathlib import Path

import agentrl

ROOT = Path(agentrl.__file__).resolve().parent
MAX_LINES = 500
# Modules allowed past the limit, with the reason.
EXEMPT = {
    # A standalone, stdlib-only program bound into the sandbox as one file; its hash labels the image.
    "sandbox/executor.py",
}


def test_no_module_is_over_the_line_limit() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in sorted(ROOT.rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    over = {k: v for k, v in long.items() if k not in EXEMPT}
    assert not over, (
        f"modules over {MAX_LINES} lines: {over}; split each along its concepts, re-exporting what "
        "callers import (CONTRIBUTING.md, Layout)"
    )
    assert set(long) >= EXEMPT, (
        f"an exempt module is back under the limit; drop it from EXEMPT: {EXEMPT - set(long)}"
    )
