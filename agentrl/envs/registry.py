"""The environment registry: ``register``/``make`` with versioned ids, plugins and gymnasium ids.

Ids look like ``name-v0`` (lowercase letters, digits, ``-`` and ``_``, then the
version). ``make("name")`` without a version picks the highest registered one.
Every registered env is also registered in gymnasium's registry as
``agentrl/<id>``, so ``gymnasium.make("agentrl/countdown-v0")`` works after
``import agentrl.envs``.

Where ids come from, loaded once on first use of the registry:

1. the shipped environments, each subpackage of ``environments`` (it calls
   :func:`register` when imported);
2. third-party packages, through the entry-point group ``agentrl.environments``:
   an entry point may name an :class:`~agentrl.envs.Env` subclass (registered as
   the entry point's name), a function (called with no arguments; it registers),
   or a module (importing it registers).

A package that fails to import does not break the registry; its error is kept
and shown when an id cannot be found.

``make``/``spec`` also take a class reference, ``module:Class`` or
``path/to/file.py:Class``: :mod:`agentrl.envs.references` imports it and registers
it on the fly (once per process), so an env class needs no packaging to be trained.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import pkgutil
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium

from agentrl.envs.core import Env
from agentrl.envs.errors import RegistrationError, UnknownEnvError
from agentrl.envs.references import is_reference, resolve_env

__all__ = ["EnvSpec", "list_envs", "load_plugins", "make", "register", "spec"]

ENTRY_POINT_GROUP = "agentrl.environments"
GYMNASIUM_NAMESPACE = "agentrl"
_ID_RE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9_-]*?)-v(?P<version>\d+)$")


@dataclass(frozen=True)
class EnvSpec:
    """One registered environment: its id, how to build it, and default constructor kwargs."""

    id: str
    entry_point: str | Callable[..., Env]
    kwargs: dict[str, Any] = field(default_factory=dict)
    deterministic: bool = True
    description: str = ""
    demo_preset: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``agentrl train`` options for the env's demo, ``{section: {key: value}}`` (sections and
    keys of ``agentrl.trainer.config``, e.g. ``{"rollout": {"env_kwargs": {...}}, "run":
    {"steps": 50}}``): the difficulty and run length at which the default tiny model learns
    the task in a few CPU minutes. The trainer applies it only when ``rollout.env_kwargs`` is
    left empty, and any key the user gives wins; empty = no demo."""

    @property
    def name(self) -> str:
        m = _ID_RE.match(self.id)
        assert m is not None
        return m.group("name")

    @property
    def version(self) -> int:
        m = _ID_RE.match(self.id)
        assert m is not None
        return int(m.group("version"))

    def load(self) -> Callable[..., Env]:
        """Import and return the env class (or factory) behind ``entry_point``."""
        if callable(self.entry_point):
            return self.entry_point
        module, _, attr = self.entry_point.partition(":")
        try:
            obj: Any = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            raise RegistrationError(
                f"env {self.id!r}: cannot load entry point {self.entry_point!r}: {type(e).__name__}: {e}"
            ) from e
        if not callable(obj):
            raise RegistrationError(f"env {self.id!r}: entry point {self.entry_point!r} is not callable")
        return obj

    def make(self, **kwargs: Any) -> Env:
        env = self.load()(**{**self.kwargs, **kwargs})
        if not isinstance(env, Env):
            raise RegistrationError(
                f"env {self.id!r}: entry point {self.entry_point!r} returned {type(env).__name__}, "
                "not an agentrl.envs.Env"
            )
        env.agentrl_spec = self  # type: ignore[attr-defined]
        if not self.deterministic:
            env.deterministic = False
        return env


_registry: dict[str, EnvSpec] = {}
_load_errors: dict[str, str] = {}
_loaded = False
_lock = threading.RLock()


def register(
    id: str,
    entry_point: str | Callable[..., Env],
    *,
    deterministic: bool = True,
    description: str = "",
    demo_preset: dict[str, dict[str, Any]] | None = None,
    override: bool = False,
    **defaults: Any,
) -> EnvSpec:
    """Register an env under a versioned id; ``defaults`` are constructor kwargs ``make`` may override.

    ``entry_point`` is an Env subclass, a factory returning an Env, or a
    ``"module:attr"`` string imported on first ``make``. Registering the same
    entry point again is a no-op; a different one under a taken id needs
    ``override=True``. ``demo_preset`` is the ``agentrl train`` setting of the
    env's demo (:attr:`EnvSpec.demo_preset`).
    """
    if not isinstance(id, str) or not _ID_RE.match(id):
        raise RegistrationError(
            f"env id {id!r} is not versioned; use lowercase 'name-v0' (letters, digits, '-', '_')"
        )
    if not (callable(entry_point) or (isinstance(entry_point, str) and ":" in entry_point)):
        raise RegistrationError(
            f"env {id!r}: entry_point must be an Env class, a factory, or 'module:attr', got {entry_point!r}"
        )
    if demo_preset is not None and not (
        isinstance(demo_preset, dict) and all(isinstance(t, dict) for t in demo_preset.values())
    ):
        raise RegistrationError(
            f"env {id!r}: demo_preset must be {{section: {{key: value}}}} (e.g. "
            f"{{'run': {{'steps': 50}}}}), got {demo_preset!r}"
        )
    new = EnvSpec(id, entry_point, dict(defaults), deterministic, description, dict(demo_preset or {}))
    with _lock:
        old = _registry.get(id)
        if old is not None and old != new and not override:
            raise RegistrationError(
                f"env id {id!r} is already registered (entry point {old.entry_point!r}); "
                "bump the version or pass override=True"
            )
        _registry[id] = new
    gym_id = f"{GYMNASIUM_NAMESPACE}/{id}"

    def _gym_factory(**kw: Any) -> Env:
        return new.make(**kw)

    gymnasium.envs.registration.registry.pop(gym_id, None)
    gymnasium.register(
        id=gym_id, entry_point=_gym_factory, nondeterministic=not deterministic, disable_env_checker=True
    )
    return new


def load_plugins() -> None:
    """Load the shipped environments and entry-point plugins once (idempotent, thread-safe)."""
    global _loaded
    with _lock:
        if _loaded:
            return
        _loaded = True
        try:
            import environments
        except ImportError as e:  # pragma: no cover - the package ships with agentrl
            _load_errors["environments"] = f"{type(e).__name__}: {e}"
        else:
            for mod in pkgutil.iter_modules(environments.__path__, "environments."):
                if mod.ispkg:
                    _import_plugin(mod.name, functools.partial(importlib.import_module, mod.name))
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            _import_plugin(f"entry point {ep.name} = {ep.value}", functools.partial(_load_entry_point, ep))


def _import_plugin(label: str, load: Callable[[], Any]) -> None:
    try:
        load()
    except Exception as e:  # one broken plugin must not hide every other env
        _load_errors[label] = f"{type(e).__name__}: {e}"


def _load_entry_point(ep: importlib.metadata.EntryPoint) -> None:
    obj = ep.load()
    if isinstance(obj, type) and issubclass(obj, Env):
        register(ep.name if _ID_RE.match(ep.name) else f"{ep.name}-v0", obj)
    elif callable(obj):
        obj()


def _resolve(id: str) -> EnvSpec:
    load_plugins()
    if is_reference(id):  # module:Class or path/to/file.py:Class, registered on first use
        return _registry[resolve_env(id)]
    if id.startswith(GYMNASIUM_NAMESPACE + "/"):
        id = id[len(GYMNASIUM_NAMESPACE) + 1 :]
    found = _registry.get(id)
    if found is not None:
        return found
    versions = [s for s in _registry.values() if s.name == id]
    if versions:
        return max(versions, key=lambda s: s.version)
    raise UnknownEnvError(_unknown_message(id))


def _unknown_message(id: str) -> str:
    candidates = sorted(set(_registry) | {s.name for s in _registry.values()})
    close = difflib.get_close_matches(id, candidates, n=1, cutoff=0.6)
    if not close:  # a typo in the name but a version given: compare names only
        m = _ID_RE.match(id)
        if m:
            close = [
                s.id
                for s in _registry.values()
                if difflib.get_close_matches(m.group("name"), [s.name], n=1, cutoff=0.6)
            ][:1]
    msg = f"unknown env {id!r}"
    msg += f"; did you mean {close[0]!r}?" if close else "; no similar id is registered"
    msg += " (agentrl envs lists all)"
    if id.endswith(".py") or "/" in id or "." in id:
        msg += "; a class of your own is named module:Class or path/to/file.py:Class"
    if _load_errors:
        msg += ". These plugins failed to load: " + "; ".join(f"{k}: {v}" for k, v in _load_errors.items())
    return msg


def spec(id: str) -> EnvSpec:
    """The :class:`EnvSpec` registered under ``id`` (or the latest version of a bare name, or the
    class a ``module:Class`` / ``path/to/file.py:Class`` reference names, registered now)."""
    return _resolve(id)


def make(id: str, **kwargs: Any) -> Env:
    """Build a fresh env instance; ``kwargs`` override the registered defaults."""
    return _resolve(id).make(**kwargs)


def list_envs() -> list[EnvSpec]:
    """Every registered env, sorted by id."""
    load_plugins()
    return [_registry[k] for k in sorted(_registry)]


def load_errors() -> dict[str, str]:
    """Plugins that failed to import, with their error (empty when all loaded)."""
    load_plugins()
    return dict(_load_errors)
