"""Config machinery: sections of frozen dataclasses to CLI flags, TOML and back, with checked types.

A config is a few *sections*, ``(name, dataclass)`` pairs (``("rollout", RolloutConfig)``);
each field has its default and a one-line docstring under it. This module knows nothing of
what the sections mean (``agentrl/trainer/config.py`` defines the run's); it provides:

- :func:`field_help`: the docstring under each field, read from the class's source with
  :mod:`ast` (dataclasses keep no per-field docs; the source is the one place they live);
- :func:`add_cli_flags`: one ``--flag-name`` per field, grouped by section, defaulting to
  "not given" (``argparse.SUPPRESS``) so that flags can be layered over a file; a ``Literal``
  becomes ``choices``, a ``bool`` a ``--x/--no-x`` pair, a ``dict`` a JSON argument, a
  ``list[str]`` a repeatable flag; a field's ``metadata`` may name its flag and metavar
  (``field(..., metadata={"flag": "--import", "metavar": "MODULE"})``, see :func:`flag_name`);
- :func:`flag_values`: the ``{section: {key: value}}`` the user gave on the command line;
- :func:`load_toml` / :func:`to_toml`: ``[section]`` tables, unknown tables and keys being
  errors with a did-you-mean; TOML has no null, so an unset (``None``) optional field is
  written as a comment and reads back unset;
- :func:`build_sections`: each section's dataclass from given values, every value checked
  against its annotation first (:func:`coerce`), so a wrong type names ``section.key``.

Every error is a :class:`~agentrl.errors.ConfigError` that says what failed, the value
seen and, where there is one, the fix.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import json
import sys
import tomllib
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn

from agentrl.errors import ConfigError

__all__ = [
    "Sections",
    "add_cli_flags",
    "base_type",
    "build_sections",
    "coerce",
    "field_help",
    "field_types",
    "flag_name",
    "flag_values",
    "load_toml",
    "to_toml",
    "unknown_key",
]

Sections = Sequence[tuple[str, type]]
"""``(section name, dataclass)`` pairs, in the order they are shown and written."""


# ---------------------------------------------------------------- introspection


def field_help(cls: type) -> dict[str, str]:
    """The docstring under each field of ``cls`` (parsed from its source)."""
    try:
        tree = ast.parse(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in zip(body, body[1:], strict=False):
        is_field = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        is_doc = (
            isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        )
        if is_field and is_doc:
            out[node.target.id] = nxt.value.value.strip()
    return out


def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotation of each field (aliases such as a ``Literal`` named in ``cls``'s module)."""
    return typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))


def base_type(tp: Any) -> tuple[Any, tuple[Any, ...] | None]:
    """(python type, literal choices or None) of an annotation."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        vals = typing.get_args(tp)
        return type(vals[0]), vals
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:  # Optional[X]: X, and None means "unset"
            return base_type(args[0])
        choices: list[Any] = []
        for arg in args:
            t, c = base_type(arg)
            choices.extend(c or ())
        return str, tuple(choices) or None
    if origin is dict or tp is dict:
        return dict, None
    if origin is list or tp is list:
        return list, None
    return tp, None


def coerce(section: str, name: str, tp: Any, value: Any) -> Any:
    """``value`` checked against annotation ``tp`` (a JSON string is parsed for a ``dict``, an int
    widened to a float); ``None`` passes only for an optional field."""
    if value is None and type(None) in typing.get_args(tp):
        return None
    base, choices = base_type(tp)
    where = f"{section}.{name}"
    if base is dict:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{where}: expected a JSON object, got {value!r} ({e})") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table / JSON object, got {value!r}")
        return value
    if base is list:
        if not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
            raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
        return list(value)
    if base is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, base) or isinstance(value, bool) and base is not bool:
        raise ConfigError(f"{where}: expected {base.__name__}, got {value!r} ({type(value).__name__})")
    if choices is not None and value not in choices:
        raise ConfigError(f"{where}={value!r}: choose one of {', '.join(map(repr, choices))}")
    return value


def fail(section: str, name: str, value: Any, why: str) -> NoReturn:
    """Raise the error for a bad field: ``section.name=value: why`` (the why says how to fix it)."""
    raise ConfigError(f"{section}.{name}={value!r}: {why}")


def unknown_key(key: str, known: list[str], where: str) -> ConfigError:
    """The error for an unknown key, with the closest known one (or the list) as the fix."""
    best = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {best[0]!r}?" if best else f"; known keys: {', '.join(known)}"
    return ConfigError(f"unknown key {key!r} in {where}{hint}")


def build_sections(sections: Sections, values: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``{section: instance}``, each built from its given values (the rest keep their defaults)."""
    parts = {}
    for sec, cls in sections:
        hints = field_types(cls)
        given = values.get(sec, {})
        known = [f.name for f in dataclasses.fields(cls)]
        for key in given:
            if key not in known:
                raise unknown_key(key, known, f"[{sec}]")
        parts[sec] = cls(**{k: coerce(sec, k, hints[k], v) for k, v in given.items()})
    return parts


# ---------------------------------------------------------------- TOML


def load_toml(path: str | Path, sections: Sections) -> dict[str, dict[str, Any]]:
    """Read a TOML file into ``{section: {key: value}}``, rejecting unknown tables and keys."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {str(p)!r} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {e}") from None
    by_name = dict(sections)
    out: dict[str, dict[str, Any]] = {}
    for sec, table in data.items():
        if sec not in by_name:
            raise unknown_key(sec, list(by_name), f"{p.name} (top-level tables are sections)")
        if not isinstance(table, dict):
            raise ConfigError(f"{p.name}: {sec!r} must be a table ([{sec}]), got {table!r}")
        known = [f.name for f in dataclasses.fields(by_name[sec])]
        for key in table:
            if key not in known:
                raise unknown_key(key, known, f"{p.name} [{sec}]")
        out[sec] = dict(table)
    return out


def to_toml(data: dict[str, dict[str, Any]]) -> str:
    """Render ``{section: {key: value}}`` as TOML that :func:`load_toml` reads back to the same values."""
    lines: list[str] = []
    for sec, table in data.items():
        lines.append(f"[{sec}]")
        for k, v in table.items():
            # TOML has no null: an unset optional field is left out, so it reads back unset
            lines.append(f"# {k} is unset" if v is None else f"{k} = {_toml_value(v)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ConfigError(f"cannot write {v!r} to TOML")


# ---------------------------------------------------------------- CLI


def flag_name(f: dataclasses.Field[Any]) -> str:
    """The command-line flag of field ``f``: ``metadata["flag"]``, else ``--`` + its name with dashes."""
    return str(f.metadata.get("flag") or "--" + f.name.replace("_", "-"))


def add_cli_flags(
    parser: argparse.ArgumentParser, sections: Sections, only: tuple[str, ...] | None = None
) -> None:
    """Add one flag per field (``--group-size``), grouped by section (``only`` of them, if given), plus ``--config``.

    Flags default to "not given", so :func:`flag_values` returns only what the user typed
    and the caller can layer it over a TOML file. The dest of a flag is ``"section.field"``.
    """
    parser.add_argument(
        "--config", default=None, metavar="RUN.TOML", help="read options from a TOML file first"
    )
    for sec, cls in sections:
        if only is not None and sec not in only:
            continue
        group = parser.add_argument_group(sec, (cls.__doc__ or "").strip())
        helps = field_help(cls)
        hints = field_types(cls)
        defaults = cls()
        for f in dataclasses.fields(cls):
            base, choices = base_type(hints[f.name])
            default = getattr(defaults, f.name)
            text = f"{helps.get(f.name, '')} (default: {json.dumps(default) if base is dict else default!r})"
            kw: dict[str, Any] = {
                "dest": f"{sec}.{f.name}",
                "default": argparse.SUPPRESS,
                "help": text.replace("%", "%%"),
            }
            if base is bool:
                kw["action"] = argparse.BooleanOptionalAction
            elif base is dict:
                kw["metavar"] = "JSON"
            elif base is list:
                kw["action"] = "append"
                kw["metavar"] = f.metadata.get("metavar", f.name.upper())
                kw["help"] += "; repeatable"
            else:
                kw["type"] = base
                kw["metavar"] = "{" + ",".join(map(str, choices)) + "}" if choices else f.name.upper()
                if choices:
                    kw["choices"] = choices
            group.add_argument(flag_name(f), **kw)


def flag_values(args: argparse.Namespace, sections: Sections) -> dict[str, dict[str, Any]]:
    """The ``{section: {key: value}}`` given as flags added by :func:`add_cli_flags`."""
    names = {sec for sec, _ in sections}
    out: dict[str, dict[str, Any]] = {}
    for dest, v in vars(args).items():
        sec, dot, key = dest.partition(".")
        if dot and sec in names:
            out.setdefault(sec, {})[key] = v
    return out
