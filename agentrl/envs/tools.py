"""Tools: the ``@tool`` decorator, JSON schemas from signatures, and :class:`ToolEnv`.

A ``@tool`` method's JSON schema comes from its signature and docstring: type
hints (``int``, ``float``, ``str``, ``bool``, ``list[X]``, ``dict[str, X]``,
``Literal[...]``, ``Optional[X]``, pydantic models) give the parameter types, a
default makes a parameter optional, the docstring's first paragraph is the
description and its ``Args:`` section (Google style) or ``:param x:`` lines
describe each parameter. Arguments are validated with a pydantic model built
from the same signature, so schema and validation never disagree.

In a :class:`ToolEnv`, an assistant message with ``tool_calls`` runs the tools
and returns one ``role="tool"`` message per call. A call that names an unknown
tool, carries invalid JSON, fails validation or raises inside the tool becomes
an error message to the model and is counted in ``info["tool_errors"]``; it
never ends the episode. An assistant message without tool calls is the final
answer: :meth:`ToolEnv.answer` scores it and the episode terminates.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, get_type_hints

import pydantic

from agentrl.envs.core import Env, StepResult
from agentrl.envs.errors import RegistrationError, ToolError
from agentrl.envs.rubric import Rubric
from agentrl.errors import InfraError
from agentrl.types import FunctionSpec, Message, ToolCall, ToolSpec

if TYPE_CHECKING:
    from agentrl.envs.mcp_tools import MCPServer, MCPToolset

__all__ = ["Tool", "ToolEnv", "tool", "tool_spec"]

F = TypeVar("F", bound=Callable[..., Any])
_TOOL_ATTR = "__agentrl_tool__"


@dataclass(frozen=True)
class Tool:
    """A tool's name, its OpenAI spec and the pydantic model that validates its arguments."""

    name: str
    spec: ToolSpec
    arguments: type[pydantic.BaseModel]
    method_name: str


def tool(fn: F | None = None, *, name: str | None = None) -> Any:
    """Mark a method of a :class:`ToolEnv` as a tool the model can call (``@tool`` or ``@tool(name=...)``)."""

    def mark(f: F) -> F:
        setattr(f, _TOOL_ATTR, name or f.__name__)
        return f

    return mark(fn) if fn is not None else mark


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Return (description, {param: description}) from a Google- or Sphinx-style docstring."""
    if not doc:
        return "", {}
    doc = inspect.cleandoc(doc)
    params: dict[str, str] = {}
    for m in re.finditer(r"^:param\s+(\w+):\s*(.+)$", doc, re.M):
        params[m.group(1)] = m.group(2).strip()
    section = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?|\s*\n)+)", doc, re.M)
    if section:
        current = None
        for line in section.group(1).splitlines():
            pm = re.match(r"^\s+(\w+)\s*(?:\([^)]*\))?:\s*(.*)$", line)
            if pm and (current is None or len(line) - len(line.lstrip()) <= 4):
                current = pm.group(1)
                params[current] = pm.group(2).strip()
            elif current and line.strip():
                params[current] = (params[current] + " " + line.strip()).strip()
    head = re.split(r"\n\s*\n|^(?:Args|Arguments|Parameters|Returns|Raises):", doc, maxsplit=1, flags=re.M)[0]
    return " ".join(head.split()), params


def _strip_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


def tool_spec(fn: Callable[..., Any], name: str | None = None) -> Tool:
    """Build the :class:`Tool` (spec + argument validator) for a function or method."""
    tool_name = name or getattr(fn, _TOOL_ATTR, None) or fn.__name__
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool_name):
        raise RegistrationError(f"tool name {tool_name!r} must match [A-Za-z0-9_-]{{1,64}} (OpenAI's rule)")
    if inspect.iscoroutinefunction(fn):
        raise RegistrationError(
            f"tool {tool_name!r} is async; tools run inside step(), which is sync — make it a plain def "
            "(step already runs in a worker thread, so blocking I/O inside a tool is fine)"
        )
    description, param_docs = _parse_docstring(fn.__doc__)
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as e:  # an unresolvable annotation is the author's bug: say which
        raise RegistrationError(f"tool {tool_name!r}: cannot resolve type hints: {e}") from None
    fields: dict[str, Any] = {}
    for pname, p in inspect.signature(fn).parameters.items():
        if pname == "self":
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise RegistrationError(
                f"tool {tool_name!r}: *args/**kwargs cannot be described by a JSON schema"
            )
        if pname not in hints:
            raise RegistrationError(
                f"tool {tool_name!r}: parameter {pname!r} has no type hint; annotate it (e.g. {pname}: int)"
            )
        default = ... if p.default is p.empty else p.default
        fields[pname] = (hints[pname], pydantic.Field(default, description=param_docs.get(pname)))
    model = pydantic.create_model(
        f"{tool_name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
    )
    schema = _strip_titles(model.model_json_schema())
    schema.setdefault("properties", {})
    schema.pop("additionalProperties", None)
    schema["additionalProperties"] = False
    spec = ToolSpec(function=FunctionSpec(name=tool_name, description=description, parameters=schema))
    return Tool(name=tool_name, spec=spec, arguments=model, method_name=fn.__name__)


def _format_result(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump_json()
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def _validation_summary(e: pydantic.ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(arguments)"
        parts.append(f"{loc}: {err['msg']} (got {err.get('input')!r:.60})")
    return "; ".join(parts)


class ToolEnv(Env):
    """An env whose model acts through ``@tool`` methods and finishes with a plain answer.

    Subclasses implement ``_reset``, ``answer`` (score the final message) and
    ``oracle_action``; tools may raise :class:`ToolError` to send an error to the
    model, raise :class:`EnvInfraError` (or any :class:`~agentrl.errors.InfraError`)
    when the env's own infrastructure failed (it propagates out of ``step``: the
    episode is aborted and retried, never scored), and may call :meth:`finish` to end the episode with a reward. Any
    other exception in a tool is reported to the model as an error. Per
    episode, ``info`` carries ``tool_calls`` and ``tool_errors`` counts.

    ``mcp_servers`` adds the tools of MCP servers (:mod:`agentrl.envs.mcp_tools`): they are
    listed and called like ``@tool`` methods; ``close()`` gives their connections back.
    """

    max_turns = 8
    _tool_table: dict[str, Tool]
    _finished: tuple[float, dict[str, Any]] | None = None
    mcp_servers: Sequence[MCPServer] = ()
    """MCP servers whose tools this env offers too (``MCPServer(command=[...])`` or ``MCPServer(url=...)``)."""
    _mcp: MCPToolset | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table: dict[str, Tool] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                if callable(value) and hasattr(value, _TOOL_ATTR):
                    t = tool_spec(value)
                    table[t.name] = t
                elif attr in {t.method_name for t in table.values()}:  # overridden without @tool
                    table = {k: v for k, v in table.items() if v.method_name != attr}
        cls._tool_table = table

    @property
    def tools(self) -> list[ToolSpec]:
        own = [t.spec for t in self._tool_table.values()]
        return own + self._mcp_tools().specs if self.mcp_servers else own

    def _mcp_tools(self) -> MCPToolset:
        if self._mcp is None:
            from agentrl.envs.mcp_tools import attach

            self._mcp = attach(self, self.mcp_servers, set(self._tool_table))
        return self._mcp

    def close(self) -> None:
        """Give back this env's MCP connections (a no-op without ``mcp_servers``)."""
        if self._mcp is not None:
            self._mcp.close()
        super().close()

    rubric: Rubric | None = None
    """If set, the default ``answer`` scores the final message with it."""

    def answer(self, message: Message) -> tuple[float, dict[str, Any]]:
        """Score the final (tool-call-free) assistant message: return (reward, info).

        The default uses ``self.rubric``, passing ``completion`` (the text), ``message``
        and ``env``; the components land in ``info["reward_components"]``.
        """
        if self.rubric is None:
            raise NotImplementedError(f"{type(self).__name__} must implement answer(message) or set a rubric")
        reward, parts = self.rubric.score(completion=message.content or "", message=message, env=self)
        return reward, {"reward_components": parts}

    def finish(self, reward: float, **info: Any) -> None:
        """Called from inside a tool: end the episode after this turn with ``reward``."""
        self._finished = (float(reward), info)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        self._finished = None
        self.tool_calls = 0
        self.tool_errors = 0
        if self.mcp_servers:
            self._mcp_tools().begin_episode()
        return super().reset(seed=seed, options=options)

    def _step(self, action: Message) -> StepResult:
        if not action.tool_calls:
            reward, info = self.answer(action)
            return StepResult([], reward, True, False, self._counts(info))
        replies = [self._call(call) for call in action.tool_calls]
        if self._finished is not None:
            reward, info = self._finished
            return StepResult(replies, reward, True, False, self._counts(info))
        return StepResult(replies, 0.0, False, False, self._counts({}))

    def _counts(self, info: dict[str, Any]) -> dict[str, Any]:
        mcp = dict(self._mcp.counts) if self._mcp is not None else {}
        return {**info, **mcp, "tool_calls": self.tool_calls, "tool_errors": self.tool_errors}

    def _call(self, call: ToolCall) -> Message:
        self.tool_calls += 1
        name = call.function.name
        try:
            t = self._tool_table.get(name)
            if t is None and self._mcp is not None and name in self._mcp.routes:
                content, is_error = self._mcp.call(call)  # EnvInfraError when the server failed
                if is_error:
                    raise ToolError(content)
                return Message(role="tool", tool_call_id=call.id, name=name, content=content)
            if t is None:
                known = (
                    ", ".join(sorted([*self._tool_table, *(self._mcp.routes if self._mcp else ())]))
                    or "(none)"
                )
                raise ToolError(f"unknown tool {name!r}; available tools: {known}")
            try:
                raw = json.loads(call.function.arguments or "{}")
            except json.JSONDecodeError as e:
                raise ToolError(f"arguments are not valid JSON ({e.msg} at char {e.pos})") from None
            if not isinstance(raw, dict):
                raise ToolError(f"arguments must be a JSON object, got {type(raw).__name__}")
            try:
                args = t.arguments.model_validate(raw)
            except pydantic.ValidationError as e:
                raise ToolError(f"invalid arguments: {_validation_summary(e)}") from None
            kwargs = {k: getattr(args, k) for k in type(args).model_fields}
            content = _format_result(getattr(self, t.method_name)(**kwargs))
        except ToolError as e:
            self.tool_errors += 1
            content = f"error: {e}"
        except InfraError:
            raise  # not the model's doing: abort the episode
        except Exception as e:  # a tool that crashes answers the model; the episode goes on
            self.tool_errors += 1
            content = f"error: tool {name!r} raised {type(e).__name__}: {e}"
        return Message(role="tool", tool_call_id=call.id, name=name, content=content)
