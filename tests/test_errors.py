"""Every deliberate raise in agentrl/ is a class of the AgentRLError tree, not a bare builtin.

``agentrl/errors.py`` promises that one ``except AgentRLError`` catches everything agentrl
raises on purpose. This test walks the source with ``ast`` and lists, as ``file:line``, every
``raise ValueError(...)`` (or any other builtin exception) that is not on the allow-list below.
Fix one by raising a class of the tree; where callers may catch the builtin, the class also
subclasses it (``class LossInputError(TrainerError, ValueError)``).
"""

from __future__ import annotations

import ast
import builtins
import inspect
from pathlib import Path

import pytest

import agentrl
import agentrl.envs as envs
from agentrl.engines import errors as engine_errors
from agentrl.envs import errors as env_errors
from agentrl.errors import AgentRLError
from agentrl.models import errors as model_errors
from agentrl.sandbox import errors as sandbox_errors
from agentrl.session import errors as session_errors
from agentrl.trainer import errors as trainer_errors

ROOT = Path(agentrl.__file__).resolve().parent
BUILTIN_EXCEPTIONS = frozenset(
    name for name, obj in vars(builtins).items() if isinstance(obj, type) and issubclass(obj, BaseException)
)

# Files not scanned at all, with the reason.
EXCLUDED_FILES = {
    # A standalone, stdlib-only program run inside the sandbox; it cannot import agentrl, and
    # what it raises is turned into an ExecResult or a protocol reply, never seen by a caller.
    "sandbox/executor.py",
    # The agent workers' program (python -m agentrl.trainer.agent_host), stdlib only so it starts
    # fast: load_entry's ValueError becomes its {"ready": false, "error": ...} answer, which the
    # pool turns into a ConfigError or an AgentError; a caller never sees it.
    "trainer/agent_host.py",
}

# Exceptions allowed anywhere, with the reason.
ALLOWED_EVERYWHERE = {
    # The protocol for "this subclass does not provide it": abstract hooks (Env._reset/_step,
    # LineChannel._fileno/_read) and the optional oracle_action(), which check_env and callers
    # recognise by this name.
    "NotImplementedError",
}

# (file, enclosing function, exception): allowed in that function only, with the reason.
ALLOWED_IN_FUNCTION = {
    # vLLM's worker extension runs inside vLLM's environment, where agentrl is not importable; its
    # errors travel back as /collective_rpc failures, which VLLMEngine raises as WeightUpdateError.
    ("engines/vllm_ext/agentrl_vllm_worker.py", "agentrl_join", "ValueError"),
    ("engines/vllm_ext/agentrl_vllm_worker.py", "_join", "ValueError"),
    ("engines/vllm_ext/agentrl_vllm_worker.py", "agentrl_receive", "ValueError"),
    ("engines/vllm_ext/agentrl_vllm_worker.py", "agentrl_receive", "TimeoutError"),
    ("engines/vllm_ext/agentrl_vllm_worker.py", "agentrl_load_lora", "ValueError"),
    # The MCP client's internal signals: run() times out like future.result, and a call whose
    # connection ended fails like one; open() and call() catch both and raise EnvInfraError.
    ("envs/mcp_client.py", "run", "TimeoutError"),
    ("envs/mcp_client.py", "_call", "ConnectionError"),
    # A trainer rank interrupted by Ctrl-C: the driver re-raises it as its own Ctrl-C (exit 130).
    ("cluster/trainers.py", "_wait", "KeyboardInterrupt"),
    # PEP 562: a module-level __getattr__ must raise AttributeError (hasattr, import machinery).
    ("engines/__init__.py", "__getattr__", "AttributeError"),
    ("envs/__init__.py", "__getattr__", "AttributeError"),
    ("session/__init__.py", "__getattr__", "AttributeError"),
    ("viewer/__init__.py", "__getattr__", "AttributeError"),
    # Internal signals while reading the executor's reply: _request and _parse_result catch
    # them at once and raise SandboxLost naming them ("malformed result (TypeError: ...)").
    ("sandbox/base.py", "recv_line", "TimeoutError"),
    ("sandbox/base.py", "_request", "ValueError"),
    ("sandbox/protocol.py", "_b64_capped", "ValueError"),
    ("sandbox/protocol.py", "_int_or_none", "TypeError"),
    ("sandbox/protocol.py", "_seconds", "TypeError"),
    ("sandbox/protocol.py", "parse_reply", "ValueError"),
    ("sandbox/protocol.py", "parse_reply", "TypeError"),
}

# pydantic turns only ValueError / AssertionError raised in a validator into a ValidationError
# (anything else escapes unwrapped), so validators raise those; callers see ValidationError.
PYDANTIC_VALIDATORS = {"field_validator", "model_validator", "validator", "root_validator"}
VALIDATOR_EXCEPTIONS = {"ValueError", "AssertionError"}

# `raise AssertionError("unreachable")` after a loop that always returns or raises marks the
# end for the type checker; it is not an error a caller can meet.
UNREACHABLE = "unreachable"


def _decorator_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names = set()
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute):
            names.add(target.attr)
        elif isinstance(target, ast.Name):
            names.add(target.id)
    return names


def _bare_builtin_raises(rel: str, source: str) -> list[str]:
    """``rel:line: Name`` for every raise of a builtin exception that the allow-lists do not cover."""
    found: list[str] = []

    def visit(node: ast.AST, fn: ast.FunctionDef | ast.AsyncFunctionDef | None) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            fn = node
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc
            target = exc.func if isinstance(exc, ast.Call) else exc
            if isinstance(target, ast.Name) and target.id in BUILTIN_EXCEPTIONS:
                name = target.id
                fn_name = fn.name if fn is not None else "<module>"
                args = exc.args if isinstance(exc, ast.Call) else []
                allowed = (
                    name in ALLOWED_EVERYWHERE
                    or (rel, fn_name, name) in ALLOWED_IN_FUNCTION
                    or (
                        fn is not None
                        and name in VALIDATOR_EXCEPTIONS
                        and bool(_decorator_names(fn) & PYDANTIC_VALIDATORS)
                    )
                    or (
                        name == "AssertionError"
                        and len(args) == 1
                        and isinstance(args[0], ast.Constant)
                        and args[0].value == UNREACHABLE
                    )
                )
                if not allowed:
                    found.append(f"{rel}:{node.lineno}: raise {name} in {fn_name}()")
        for child in ast.iter_child_nodes(node):
            visit(child, fn)

    visit(ast.parse(source, filename=rel), None)
    return found


def test_no_bare_builtin_raises_in_agentrl() -> None:
    files = sorted(ROOT.rglob("*.py"))
    assert len(files) > 50  # the walk found the package
    offenders = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel not in EXCLUDED_FILES:
            offenders += _bare_builtin_raises(rel, path.read_text(encoding="utf-8"))
    assert not offenders, (
        "raise a class of the AgentRLError tree (see agentrl/errors.py), not a bare builtin:\n  "
        + "\n  ".join(offenders)
    )


def test_allow_list_entries_still_exist() -> None:
    """A stale allow-list entry would silently allow a future bare raise in that function."""
    for rel, fn_name, _ in ALLOWED_IN_FUNCTION:
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        fns = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert fn_name in fns, f"{rel} has no function {fn_name}(); drop it from ALLOWED_IN_FUNCTION"
    for rel in EXCLUDED_FILES:
        assert (ROOT / rel).is_file(), rel


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ('def f():\n    raise ValueError("x")\n', True),
        ("def f():\n    raise RuntimeError\n", True),
        ('raise KeyError("k")\n', True),
        ('def f():\n    raise AssertionError("not unreachable")\n', True),
        ('@other_decorator\ndef f(v):\n    raise ValueError("x")\n', True),
        ('def f():\n    raise ConfigError("x")\n', False),
        ('def f():\n    raise AssertionError("unreachable")\n', False),
        ('@field_validator("a")\ndef f(v):\n    raise ValueError("x")\n', False),
        ('@model_validator(mode="after")\ndef f(self):\n    raise ValueError("x")\n', False),
        ("def f():\n    raise NotImplementedError\n", False),
        ("def f():\n    try:\n        g()\n    except OSError as e:\n        raise\n", False),
    ],
)
def test_the_walk_flags_bare_builtins(source: str, flagged: bool) -> None:
    assert bool(_bare_builtin_raises("somewhere/new.py", source)) is flagged


ERROR_MODULES = [
    agentrl.errors,
    engine_errors,
    env_errors,
    model_errors,
    sandbox_errors,
    session_errors,
    trainer_errors,
]


@pytest.mark.parametrize("module", ERROR_MODULES, ids=lambda m: m.__name__)
def test_every_error_class_is_in_the_tree_and_drawn(module) -> None:
    """Each class in an errors.py derives from AgentRLError and appears in its module's tree."""
    doc = inspect.getdoc(module) or ""
    for name in module.__all__:
        cls = getattr(module, name)
        assert issubclass(cls, AgentRLError), f"{module.__name__}.{name} is not an AgentRLError"
        assert name in doc, f"{module.__name__}.{name} is missing from the tree in the module docstring"


def test_new_classes_keep_the_builtin_callers_catch() -> None:
    assert issubclass(agentrl.TrajectoryError, ValueError)
    assert issubclass(trainer_errors.LossInputError, ValueError)
    assert issubclass(envs.EnvDefinitionError, ValueError)
    assert issubclass(agentrl.errors.ServerStartError, RuntimeError)
    assert issubclass(agentrl.ConfigError, ValueError)
