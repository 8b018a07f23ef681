"""Tools for dataset envs: plain functions from a module or file, offered per row (``--tools``).

``--tools path/to/tools.py`` (or ``module``) makes every public function of the module marked
with :func:`agentrl.envs.tool` a tool the model can call, with the JSON schema and argument
validation of a ``ToolEnv``'s ``@tool`` methods (:mod:`agentrl.envs.tools`); a module without
marked functions offers all its public functions defined in it. A row's ``tools`` column (a list
of names), when present, picks the tools that row offers. Tool calls, errors and their counting
are the ``ToolEnv``'s: the model's mistakes become tool messages, an ``InfraError`` aborts the
episode.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import Any

from agentrl.envs.errors import DatasetSourceError, EnvReferenceError
from agentrl.envs.tools import ToolEnv, tool

__all__ = ["load_toolset"]


@functools.lru_cache(maxsize=16)
def load_toolset(ref: str) -> type[ToolEnv]:
    """A :class:`ToolEnv` subclass whose ``@tool`` methods call the functions of ``ref``."""
    from agentrl.envs.registry import load_file_module, load_module

    try:
        module = (
            load_file_module(ref, ref, kind="tools")
            if ref.endswith(".py") or "/" in ref
            else load_module(ref, f"tools {ref!r}")
        )
    except EnvReferenceError as e:
        raise DatasetSourceError(str(e)) from e
    funcs = _functions(module)
    marked = {n: f for n, f in funcs.items() if hasattr(f, "__agentrl_tool__")}
    chosen = marked or funcs
    if not chosen:
        raise DatasetSourceError(
            f"tools {ref!r}: the module defines no public function to offer as a tool; define one "
            "(type hints on every parameter, a docstring) and mark it with @agentrl.envs.tool"
        )
    methods: dict[str, Any] = {}
    for name, fn in chosen.items():
        methods[f"_tool_{name}"] = tool(_as_method(fn), name=getattr(fn, "__agentrl_tool__", name))
    return types.new_class("DatasetTools", (ToolEnv,), exec_body=lambda ns: ns.update(methods))


def _functions(module: types.ModuleType) -> dict[str, Callable[..., Any]]:
    return {
        name: fn
        for name, fn in vars(module).items()
        if inspect.isfunction(fn) and not name.startswith("_") and fn.__module__ == module.__name__
    }


def _as_method(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def method(self: Any, **kwargs: Any) -> Any:
        return fn(**kwargs)

    method.__name__ = method.__qualname__ = f"_tool_{fn.__name__}"  # never shadows an Env attribute
    sig = inspect.signature(fn)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    method.__signature__ = sig.replace(parameters=[self_param, *sig.parameters.values()])  # type: ignore[attr-defined]
    return method
