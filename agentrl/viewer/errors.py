"""Errors of the trajectory viewer: a request it cannot answer, with the HTTP status it answers.

::

    AgentRLError
    └── ViewerError            (ValueError) a run directory that is none, a bad query
        ├── BadQueryError      400: a filter value, page or run index that cannot be read
        └── NotFoundError      404: an unknown run index, episode key, group or task
"""

from __future__ import annotations

from agentrl.errors import AgentRLError

__all__ = ["BadQueryError", "NotFoundError", "ViewerError"]


class ViewerError(AgentRLError, ValueError):
    """The viewer cannot do what was asked; ``status`` is the HTTP status its API answers with."""

    status = 400


class BadQueryError(ViewerError):
    """A query parameter's value cannot be used (the message names it, the value and what is accepted)."""

    status = 400


class NotFoundError(ViewerError):
    """A run index, episode key, group or task the viewer does not hold."""

    status = 404
