"""Env sources: reference prefixes such as ``reasoning-gym:NAME`` that name one env of a large family.

A source stands for many envs that are not worth registering one by one (reasoning-gym's
100+ task families): ``PREFIX:NAME`` is resolved by the source's ``resolve(NAME)``, which
registers an id for that member on first use and returns it. The registry's
:func:`~agentrl.envs.resolve_env` (so ``make``, ``spec``, ``--env``, ``serve-env --env``)
looks the prefix up before treating a reference as ``module:Class``; a prefix must
contain a ``-``, which no importable module name does, so the two forms never clash.

``resolve`` must be a pure function of ``NAME`` (it registers the same id, with the same
entry point and defaults, in every process), so every ``torchrun`` rank and every env
server that resolves the same reference gets the same id. It raises an
:class:`~agentrl.envs.EnvError` naming the reference and the fix for a bad ``NAME`` or a
missing dependency. ``agentrl envs`` lists each source on one line.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from agentrl.envs.errors import RegistrationError

__all__ = ["EnvSource", "find_source", "list_sources", "register_source"]

_PREFIX_RE = re.compile(r"^[a-z0-9][a-z0-9_]*(-[a-z0-9_]+)+$")


@dataclass(frozen=True)
class EnvSource:
    """A reference prefix and the function that turns ``PREFIX:NAME`` into a registered id."""

    prefix: str
    resolve: Callable[[str], str]
    """``NAME`` -> the id it registered (or had registered already) for that member."""
    description: str = ""


_sources: dict[str, EnvSource] = {}
_lock = threading.Lock()


def register_source(prefix: str, resolve: Callable[[str], str], *, description: str = "") -> EnvSource:
    """Make ``prefix:NAME`` an env reference resolved by ``resolve(NAME)`` (see the module docstring).

    Registering the same ``resolve`` again is a no-op; a different one under a taken prefix
    is a :class:`RegistrationError`.
    """
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise RegistrationError(
            f"env source prefix {prefix!r} must be lowercase words joined by '-' (e.g. 'reasoning-gym'), "
            "so that it can never be a module name"
        )
    if not callable(resolve):
        raise RegistrationError(f"env source {prefix!r}: resolve must be callable, got {resolve!r}")
    new = EnvSource(prefix, resolve, description)
    with _lock:
        old = _sources.get(prefix)
        if old is not None and old.resolve is not resolve:
            raise RegistrationError(f"env source {prefix!r} is already registered (by {old.resolve!r})")
        _sources[prefix] = new
    return new


def find_source(reference: str) -> EnvSource | None:
    """The source whose prefix ``reference`` (``PREFIX:NAME``) starts with, if any."""
    prefix, sep, _ = reference.partition(":")
    return _sources.get(prefix) if sep else None


def list_sources() -> list[EnvSource]:
    """Every registered source, sorted by prefix (call ``load_plugins()`` first to see the shipped ones)."""
    return [_sources[k] for k in sorted(_sources)]
