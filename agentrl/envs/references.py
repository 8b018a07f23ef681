"""Env references: a registered id, ``module:Class`` or ``path/to/file.py:Class``, turned into a registered id.

What ``--env`` (and ``make``/``spec``) accept:

- ``countdown-v0`` or ``countdown``: a registered id, as always (an unknown one raises
  :class:`~agentrl.envs.UnknownEnvError` with a did-you-mean);
- ``my_pkg.envs:MyEnv``: the module is imported; like ``python -m``, the current directory
  is put on ``sys.path`` first, so a module next to you imports without ``PYTHONPATH``;
- ``path/to/file.py:MyEnv`` (a path ending in ``.py`` or containing a ``/``, relative to the
  current directory): the file is loaded as a module of its own, named after its absolute path
  (``agentrl_envfile_<hash>_<stem>``), so loading it again in this process reuses it; a file
  this process imported already as a module (``--import``) is reused, not run a second time.

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
import hashlib
import importlib
import importlib.util
import os
import re
import sys
import threading
import traceback
import types
from collections.abc import Iterable
from pathlib import Path

from agentrl.envs.core import Env
from agentrl.envs.errors import EnvReferenceError

__all__ = ["import_modules", "is_reference", "resolve_env"]

FILE_MODULE_PREFIX = "agentrl_envfile_"
_resolved: dict[str, str] = {}
_lock = threading.RLock()


def is_reference(env: str) -> bool:
    """Whether ``env`` names a class (``module:Class``, ``file.py:Class``) rather than a registered id."""
    return ":" in env


def resolve_env(env: str) -> str:
    """The registered id of ``env``: a registered id, ``module:Class`` or ``path/to/file.py:Class``.

    A class reference is imported and registered on first use (see the module docstring);
    raises :class:`EnvReferenceError` (a reference) or ``UnknownEnvError`` (an id).
    """
    from agentrl.envs import registry

    if not is_reference(env):
        return registry.spec(env).id
    found = _resolved.get(env)
    if found is not None:
        return found
    with _lock:
        found = _resolved.get(env)
        if found is None:
            found = _register(env)
            _resolved[env] = found
        return found


def import_modules(modules: Iterable[str], *, flag: str = "--import") -> None:
    """Import each module (it registers envs), the current directory first on ``sys.path`` like ``python -m``."""
    for module in modules:
        _import_module(module, f"{flag} {module}")


# ---------------------------------------------------------------- resolving


def _register(ref: str) -> str:
    from agentrl.envs import registry

    where, _, attr = ref.rpartition(":")
    if not where or not attr:
        raise EnvReferenceError(
            f"env {ref!r}: expected module:Class or path/to/file.py:Class (both parts non-empty)"
        )
    if where.endswith(".py") or "/" in where or os.sep in where:
        module, canonical = _load_file(ref, where), f"{Path(where).resolve()}:{attr}"
    else:
        module, canonical = _import_module(where, f"env {ref!r}"), f"{where}:{attr}"
    cls = _find_class(ref, module, attr)
    named = f"{cls.__module__}:{cls.__qualname__}"
    same = [s.id for s in registry.list_envs() if s.entry_point is cls or s.entry_point == named]
    if len(same) == 1:
        return same[0]
    digest = hashlib.sha1(canonical.encode()).hexdigest()[:8]
    env_id = f"{_slug(cls.__name__)}-{digest}-v0"
    doc = (cls.__doc__ or "").strip().splitlines()
    registry.register(env_id, cls, description=doc[0] if doc else f"from {ref}")
    return env_id


def _put_cwd_on_path() -> str:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return cwd


def _import_module(module: str, what: str) -> types.ModuleType:
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


def _load_file(ref: str, where: str) -> types.ModuleType:
    path = Path(where)
    full = path.resolve()
    if not full.is_file():
        near = ""
        if full.parent.is_dir():
            siblings = [p.name for p in full.parent.glob("*.py")]
            close = difflib.get_close_matches(full.name, siblings, n=1)
            near = f"; did you mean {str(path.with_name(close[0]))!r}?" if close else ""
        raise EnvReferenceError(
            f"env {ref!r}: file {where!r} does not exist (relative paths are from the current "
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
        raise EnvReferenceError(f"env {ref!r}: {where!r} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses and pickling look the module up
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise EnvReferenceError(f"env {ref!r}: loading {where!r} failed: {_describe(e)}") from e
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
