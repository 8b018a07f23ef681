"""The trajectory viewer: ``agentrl view RUN_DIR...`` serves a run's curves and stored episodes to a browser.

:func:`~agentrl.viewer.app.make_app` builds the web app (a JSON API and a page of plain JavaScript,
``agentrl/viewer/static/``, nothing fetched from the internet); :mod:`agentrl.viewer.commands` the
command. ``docs/viewer.md`` shows what the page draws. FastAPI is imported on first use of ``make_app``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["make_app"]


def __getattr__(name: str) -> Any:
    if name == "make_app":
        from agentrl.viewer.app import make_app

        return make_app
    raise AttributeError(f"module 'agentrl.viewer' has no attribute {name!r}")
