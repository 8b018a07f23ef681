"""The environment registry: ``register``/``make`` with versioned ids, plugins and gymnasium ids.

Ids look like ``name-v0`` (lowercase letters, digits, ``-`` and ``_``, then the
version). ``make("name")`` without a version picks the highest registered one.
Every registered env is also registered in gymnasium's registry as
``agentrl/<id>``, so ``gymnasium.make("agentrl/countdown-v0")`` works once the
registry has loaded: after a ``make``, ``spec`` or ``list_envs``, or ``load_plugins()``.

Where ids come from, loaded once on first use of the registry (``import agentrl.envs`` loads
nothing, so the shipped ``environments`` package, which imports ``agentrl.envs``, is never
imported by it):

1. the shipped environments, each subpackage of ``environments`` (it calls
   :func:`register` when imported);
2. third-party packages, through the entry-point group ``agentrl.environments``:
   an entry point may name an :class:`~agentrl.envs.Env` subclass (registered as
   the entry point's name), a function (called with no arguments; it registers),
   or a module (importing it registers).

A package that fails to import does not break the registry; its error is kept
and shown when an id cannot be found.

Env references, what ``--env`` (and ``make``/``spec``) accept, each turned into a registered id:

- ``countdown-v0`` or ``countdown``: a registered id, as always (an unknown one raises
  :class:`~agentrl.envs.UnknownEnvError` with a did-you-mean);
- ``my_pkg.envs:MyEnv``: the module is imported; like ``python -m``, the current directory
  is put on ``sys.path`` first, so a module next to you imports without ``PYTHONPATH``;
- ``path/to/file.py:MyEnv`` (a path ending in ``.py`` or containing a ``/``, relative to the
  current directory): the file is loaded as a module of its own, named after its absolute path
  (``agentrl_envfile_<hash>_<stem>``), so loading it again in this process reuses it; a file
  this process imported already as a module (``--import``) is reused, not run a second time;
- ``PREFIX:NAME`` where ``PREFIX`` is an env namespace (``reasoning-gym:leg_counting``;
  :mod:`agentrl.envs.namespaces`): it registers the member's id on first use and returns it.

The class must be an :class:`~agentrl.envs.Env` subclass. If the module registered that class
under exactly one id (``examples/reverse_env.py`` registers ``reverse-v0``), the reference
resolves to that id, with its defaults and demo preset; otherwise it is registered on the fly
as ``<class>-<hash>-v0``, the hash taken over ``module:Class`` or ``/absolute/path.py:Class``.
The id is a function of the reference and the current directory, so every worker thread and
every ``torchrun`` rank that resolves the same reference gets the same id. A reference is
resolved once per process (then cached); failures raise :class:`EnvReferenceError` naming the
reference, the cause and the fix.

:func:`import_modules` is ``--import MODULE`` (``serve-env``, ``check-env``, ``train``, ``sft``,
``eval``): import modules that register envs, with the same ``sys.path`` rule.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import pkgutil
import re
import sys
import threading
import traceback
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium

from agentrl.envs.core import Env
from agentrl.envs.errors import EnvReferenceError, RegistrationError, UnknownEnvError
from agentrl.envs.namespaces import resolve_namespaced

__all__ = [
    "EnvSpec",
    "import_modules",
    "is_reference",
    "list_envs",
    "load_errors",
    "load_plugins",
    "make",
    "register",
    "resolve_env",
    "spec",
]

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


# ---------------------------------------------------------------- env references

FILE_MODULE_PREFIX = "agentrl_envfile_"
_resolved: dict[str, str] = {}
_ref_lock = threading.RLock()


def is_reference(env: str) -> bool:
    """Whether ``env`` is a reference (``module:Class``, ``file.py:Class``, ``namespace:NAME``), not an id."""
    return ":" in env


def resolve_env(env: str) -> str:
    """The registered id of ``env``: a registered id, ``module:Class`` or ``path/to/file.py:Class``.

    A class reference is imported and registered on first use (see the module docstring);
    raises :class:`EnvReferenceError` (a reference) or ``UnknownEnvError`` (an id).
    """
    if not is_reference(env):
        return spec(env).id
    found = _resolved.get(env)
    if found is not None:
        return found
    with _ref_lock:
        found = _resolved.get(env)
        if found is None:
            found = _register(env)
            _resolved[env] = found
        return found


def import_modules(modules: Iterable[str], *, flag: str = "--import") -> None:
    """Import each module (it registers envs), the current directory first on ``sys.path`` like ``python -m``."""
    for module in modules:
        load_module(module, f"{flag} {module}")


def _register(ref: str) -> str:
    load_plugins()  # the shipped namespaces register themselves
    found = resolve_namespaced(ref, _registry.__contains__)
    if found is not None:
        return found
    where, _, attr = ref.rpartition(":")
    if not where or not attr:
        raise EnvReferenceError(
            f"env {ref!r}: expected module:Class or path/to/file.py:Class (both parts non-empty)"
        )
    if where.endswith(".py") or "/" in where or os.sep in where:
        module, canonical = load_file_module(ref, where), f"{Path(where).resolve()}:{attr}"
    else:
        module, canonical = load_module(where, f"env {ref!r}"), f"{where}:{attr}"
    cls = _find_class(ref, module, attr)
    named = f"{cls.__module__}:{cls.__qualname__}"
    same = [s.id for s in list_envs() if s.entry_point is cls or s.entry_point == named]
    if len(same) == 1:
        return same[0]
    digest = hashlib.sha1(canonical.encode()).hexdigest()[:8]
    env_id = f"{_slug(cls.__name__)}-{digest}-v0"
    doc = (cls.__doc__ or "").strip().splitlines()
    register(env_id, cls, description=doc[0] if doc else f"from {ref}")
    return env_id


def _put_cwd_on_path() -> str:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return cwd


def load_module(module: str, what: str) -> types.ModuleType:
    """Import ``module`` with the current directory on ``sys.path``; failures name ``what``."""
    cwd = _put_cwd_on_path()
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
            raise EnvReferenceError(
                f"{what}: No module named {e.name!r} on sys.path (the current directory {cwd} "
                "is on it); run from the directory that holds it, set PYTHONPATH, or name "
                "the file: path/to/file.py:Class"
            ) from e
        raise EnvReferenceError(f"{what}: importing {module!r} failed: {_describe(e)}") from e
    except Exception as e:  # the module's own code raised: name the exception and where
        raise EnvReferenceError(f"{what}: importing {module!r} failed: {_describe(e)}") from e


def load_file_module(ref: str, where: str, kind: str = "env") -> types.ModuleType:
    """Load ``where`` (a ``.py`` path) as a module of its own, once per process (see the module docstring);
    ``kind`` names what ``ref`` is in the errors (``env``, ``reward``, ...)."""
    path = Path(where)
    full = path.resolve()
    if not full.is_file():
        near = ""
        if full.parent.is_dir():
            siblings = [p.name for p in full.parent.glob("*.py")]
            close = difflib.get_close_matches(full.name, siblings, n=1)
            near = f"; did you mean {str(path.with_name(close[0]))!r}?" if close else ""
        raise EnvReferenceError(
            f"{kind} {ref!r}: file {where!r} does not exist (relative paths are from the current "
            f"directory {os.getcwd()}){near}"
        )
    digest = hashlib.sha1(str(full).encode()).hexdigest()[:8]
    name = f"{FILE_MODULE_PREFIX}{digest}_{re.sub(r'[^0-9A-Za-z_]', '_', full.stem)}"
    if name in sys.modules:
        return sys.modules[name]
    for module in list(sys.modules.values()):  # imported already (--import, PYTHONPATH): not run twice
        file = getattr(module, "__file__", None)
        if file and file.endswith(full.name) and Path(file).resolve() == full:
            return module
    spec = importlib.util.spec_from_file_location(name, full)
    if spec is None or spec.loader is None:
        raise EnvReferenceError(f"{kind} {ref!r}: {where!r} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses and pickling look the module up
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise EnvReferenceError(f"{kind} {ref!r}: loading {where!r} failed: {_describe(e)}") from e
    return module


def _find_class(ref: str, module: types.ModuleType, attr: str) -> type[Env]:
    obj: object = module
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        envs = _env_classes(module)
        close = difflib.get_close_matches(attr, envs, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise EnvReferenceError(
            f"env {ref!r}: {_where(module)} has no attribute {attr!r}{hint} ({_listing(envs)})"
        ) from None
    if not (isinstance(obj, type) and issubclass(obj, Env)):
        what = type(obj).__name__
        kind = (
            f"class {obj.__name__!r}"
            if isinstance(obj, type)
            else f"{'an' if what[0] in 'aeiou' else 'a'} {what}"
        )
        raise EnvReferenceError(
            f"env {ref!r}: {attr!r} in {_where(module)} is {kind}, not a subclass of agentrl.envs.Env "
            f"({_listing(_env_classes(module))})"
        )
    if obj.__module__ in ("agentrl.envs.core", "agentrl.envs.tools"):  # Env, ToolEnv themselves
        raise EnvReferenceError(
            f"env {ref!r}: {obj.__name__} is agentrl's base class, not an environment; name your "
            "subclass of it"
        )
    return obj


def _env_classes(module: types.ModuleType) -> list[str]:
    """The Env subclasses a module holds, leaving out agentrl's own (Env, ToolEnv, ...)."""
    return sorted(
        name
        for name, obj in vars(module).items()
        if isinstance(obj, type)
        and issubclass(obj, Env)
        and not (obj.__module__ == "agentrl" or obj.__module__.startswith("agentrl."))
    )


def _listing(envs: list[str]) -> str:
    return f"Env subclasses there: {', '.join(envs)}" if envs else "it defines no Env subclass"


def _where(module: types.ModuleType) -> str:
    if module.__name__.startswith(FILE_MODULE_PREFIX) and module.__file__:
        return repr(_short(module.__file__))
    return f"module {module.__name__!r}"


def _describe(e: BaseException) -> str:
    """``Type: message (at file:line)``, the line being the innermost frame of the traceback."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith("<")]
    at = f" (at {_short(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    if isinstance(e, SyntaxError):  # its message already names the file and line
        at = ""
    return f"{type(e).__name__}: {e}{at}"


def _short(path: str) -> str:
    """``path`` relative to the current directory when it lies below it, else as it is."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", name.lower()).strip("_") or "env"  # ids start alphanumeric
