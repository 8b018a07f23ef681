"""Env namespaces: reference prefixes such as ``reasoning-gym:NAME`` that name one env of a large family.

A namespace stands for many envs that are not worth registering one by one (reasoning-gym's
100+ task families): ``PREFIX:NAME`` is resolved by the namespace's ``resolve(NAME)``, which
registers an id for that member on first use and returns it. The registry's
:func:`~agentrl.envs.resolve_env` (so ``make``, ``spec``, ``--env``, ``serve-env --env``)
looks the prefix up before treating a reference as ``module:Class``; a prefix must
contain a ``-``, which no importable module name does, so the two forms never clash.

``resolve`` must be a pure function of ``NAME`` (it registers the same id, with the same
entry point and defaults, in every process), so every ``torchrun`` rank and every env
server that resolves the same reference gets the same id. It raises an
:class:`~agentrl.envs.EnvError` naming the reference and the fix for a bad ``NAME`` or a
missing dependency. ``agentrl envs`` lists each namespace on one line.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from agentrl.envs.errors import RegistrationError

__all__ = ["EnvNamespace", "list_namespaces", "register_namespace", "resolve_namespaced"]

_PREFIX_RE = re.compile(r"^[a-z0-9][a-z0-9_]*(-[a-z0-9_]+)+$")


@dataclass(frozen=True)
class EnvNamespace:
    """A reference prefix and the function that turns ``PREFIX:NAME`` into a registered id."""

    prefix: str
    resolve: Callable[[str], str]
    """``NAME`` -> the id it registered (or had registered already) for that member."""
    description: str = ""


_namespaces: dict[str, EnvNamespace] = {}
_lock = threading.Lock()


def register_namespace(prefix: str, resolve: Callable[[str], str], *, description: str = "") -> EnvNamespace:
    """Make ``prefix:NAME`` an env reference resolved by ``resolve(NAME)`` (see the module docstring).

    Registering the same ``resolve`` again is a no-op; a different one under a taken prefix
    is a :class:`RegistrationError`.
    """
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise RegistrationError(
            f"env namespace {prefix!r} must be lowercase words joined by '-' (e.g. 'reasoning-gym'), "
            "so that it can never be a module name"
        )
    if not callable(resolve):
        raise RegistrationError(f"env namespace {prefix!r}: resolve must be callable, got {resolve!r}")
    new = EnvNamespace(prefix, resolve, description)
    with _lock:
        old = _namespaces.get(prefix)
        if old is not None and old.resolve is not resolve:
            raise RegistrationError(f"env namespace {prefix!r} is already registered (by {old.resolve!r})")
        _namespaces[prefix] = new
    return new


def resolve_namespaced(reference: str, registered: Callable[[str], bool]) -> str | None:
    """The id a namespace resolves ``PREFIX:NAME`` to, or None when no namespace has that prefix.

    ``registered(id)`` says whether the registry holds the id; a namespace that returns one it
    did not register is a :class:`RegistrationError`.
    """
    prefix, sep, name = reference.partition(":")
    namespace = _namespaces.get(prefix) if sep else None
    if namespace is None:
        return None
    env_id = namespace.resolve(name)
    if not registered(env_id):
        raise RegistrationError(
            f"env namespace {prefix!r} resolved {reference!r} to {env_id!r}, not registered"
        )
    return env_id


def list_namespaces() -> list[EnvNamespace]:
    """Every registered namespace, sorted by prefix (``load_plugins()`` registers the shipped ones)."""
    return [_namespaces[k] for k in sorted(_namespaces)]
