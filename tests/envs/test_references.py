"""Env references: ``module:Class`` and ``path/to/file.py:Class`` become registered ids; each failure says why."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from agentrl.envs import (
    EnvReferenceError,
    UnknownEnvError,
    import_modules,
    make,
    resolve_env,
    spec,
)
from agentrl.envs.server import create_app
from agentrl.envs.server.config import ServerConfig
from agentrl.httpkit import BackgroundServer

ROOT = Path(__file__).resolve().parents[2]

ENV_SOURCE = '''
from agentrl.envs import Env, StepResult
from agentrl.types import Message


class {name}(Env):
    """Say hi."""

    def _reset(self, options):
        return [Message(role="user", content="say hi")], {{}}

    def _step(self, action):
        return StepResult([], float(action.content == "hi"), True)

    def oracle_action(self):
        return Message(role="assistant", content="hi")


NOT_AN_ENV = 3
'''


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh current directory; sys.path is restored afterwards (the resolver adds the cwd)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    return tmp_path


def _write(path: Path, name: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(ENV_SOURCE.format(name=name))


def test_a_registered_id_resolves_as_before() -> None:
    assert resolve_env("countdown") == "countdown-v0"
    assert resolve_env("countdown-v0") == "countdown-v0"


def test_module_class_imports_from_the_current_directory(workdir: Path) -> None:
    _write(workdir / "refmod_hi.py", "HiEnv")
    env_id = resolve_env("refmod_hi:HiEnv")  # no PYTHONPATH: the cwd is on sys.path, as with python -m
    assert env_id.startswith("hienv-") and env_id.endswith("-v0")
    assert resolve_env("refmod_hi:HiEnv") == env_id
    env = make("refmod_hi:HiEnv")
    messages, _ = env.reset(seed=0)
    assert messages[0].content == "say hi"
    assert env.step(env.oracle_action())[1] == 1.0
    assert make(env_id).__class__ is env.__class__
    assert spec(env_id).description == "Say hi."


def test_file_class_loads_the_file_and_the_id_is_stable(workdir: Path) -> None:
    _write(workdir / "envs" / "hi_file.py", "FileHiEnv")
    ref = "envs/hi_file.py:FileHiEnv"
    env_id = resolve_env(ref)
    assert env_id.startswith("filehienv-") and env_id.endswith("-v0")
    seen: list[str] = []
    threads = [threading.Thread(target=lambda: seen.append(make(ref).agentrl_spec.id)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [env_id] * 4
    # another process (a torchrun rank) resolving the same reference from the same directory
    code = f"from agentrl.envs import resolve_env; print(resolve_env({ref!r}))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == env_id


def test_a_class_the_file_registers_resolves_to_its_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert resolve_env("examples/reverse_env.py:ReverseEnv") == "reverse-v0"
    assert spec("examples/reverse_env.py:ReverseEnv").description == "single turn: reverse a word"


def test_a_missing_file_is_named_with_a_did_you_mean(workdir: Path) -> None:
    _write(workdir / "my_env.py", "MyEnv")
    with pytest.raises(EnvReferenceError) as e:
        resolve_env("my_evn.py:MyEnv")
    assert str(e.value) == (
        f"env 'my_evn.py:MyEnv': file 'my_evn.py' does not exist (relative paths are from the current "
        f"directory {workdir}); did you mean 'my_env.py'?"
    )


def test_an_import_error_names_the_exception_and_line(workdir: Path) -> None:
    (workdir / "boom_env.py").write_text("import os\nraise RuntimeError('boom at import')\n")
    with pytest.raises(EnvReferenceError) as e:
        resolve_env("boom_env.py:X")
    assert str(e.value) == (
        "env 'boom_env.py:X': loading 'boom_env.py' failed: RuntimeError: boom at import (at boom_env.py:2)"
    )
    with pytest.raises(EnvReferenceError, match=r"importing 'boom_env' failed: RuntimeError: boom at import"):
        resolve_env("boom_env:X")
    (workdir / "typo_env.py").write_text("import no_such_dependency_xyz\n")
    with pytest.raises(EnvReferenceError) as e:
        resolve_env("typo_env:X")
    assert "ModuleNotFoundError: No module named 'no_such_dependency_xyz' (at typo_env.py:1)" in str(e.value)


def test_a_module_not_on_the_path_says_how_to_fix_it(workdir: Path) -> None:
    with pytest.raises(EnvReferenceError) as e:
        resolve_env("no_such_env_module:Env1")
    assert str(e.value) == (
        f"env 'no_such_env_module:Env1': No module named 'no_such_env_module' on sys.path (the current "
        f"directory {workdir} is on it); run from the directory that holds it, set PYTHONPATH, or name "
        "the file: path/to/file.py:Class"
    )


def test_a_missing_class_gets_a_did_you_mean_over_the_modules_envs(workdir: Path) -> None:
    _write(workdir / "cls_env.py", "CountingEnv")
    with pytest.raises(EnvReferenceError) as e:
        resolve_env("cls_env.py:CountingEnvv")
    assert str(e.value) == (
        "env 'cls_env.py:CountingEnvv': 'cls_env.py' has no attribute 'CountingEnvv'; "
        "did you mean 'CountingEnv'? (Env subclasses there: CountingEnv)"
    )
    (workdir / "empty_env.py").write_text("x = 1\n")
    with pytest.raises(
        EnvReferenceError, match=r"module 'empty_env' has no attribute 'Y' \(it defines no Env"
    ):
        resolve_env("empty_env:Y")


def test_something_that_is_not_an_env_class_is_refused(workdir: Path) -> None:
    _write(workdir / "notenv.py", "RealEnv")
    with pytest.raises(EnvReferenceError) as e:
        resolve_env("notenv.py:NOT_AN_ENV")
    assert str(e.value) == (
        "env 'notenv.py:NOT_AN_ENV': 'NOT_AN_ENV' in 'notenv.py' is an int, not a subclass of "
        "agentrl.envs.Env (Env subclasses there: RealEnv)"
    )
    with pytest.raises(EnvReferenceError, match=r"is class 'Message', not a subclass of agentrl.envs.Env"):
        resolve_env("notenv.py:Message")
    with pytest.raises(EnvReferenceError, match=r"Env is agentrl's base class, not an environment"):
        resolve_env("agentrl.envs:Env")


def test_an_unknown_plain_id_keeps_the_did_you_mean() -> None:
    with pytest.raises(UnknownEnvError) as e:
        resolve_env("countdwn")
    assert str(e.value) == "unknown env 'countdwn'; did you mean 'countdown'? (agentrl envs lists all)"
    with pytest.raises(
        UnknownEnvError, match=r"a class of your own is named module:Class or path/to/file.py:Class"
    ):
        resolve_env("examples/reverse_env.py")  # the :Class forgotten


def test_import_modules_names_the_flag_and_uses_the_current_directory(workdir: Path) -> None:
    (workdir / "registers_one.py").write_text(
        ENV_SOURCE.format(name="RegOne")
        + "\nfrom agentrl.envs import register\nregister('regone-v0', RegOne)\n"
    )
    import_modules(["registers_one"])
    assert resolve_env("regone") == "regone-v0"
    assert resolve_env("registers_one:RegOne") == "regone-v0"  # the id the module registered
    # the same file named by path is the module already imported, not a second copy
    assert resolve_env("registers_one.py:RegOne") == "regone-v0"
    with pytest.raises(EnvReferenceError, match=r"^--import nope_mod_xyz: No module named 'nope_mod_xyz'"):
        import_modules(["nope_mod_xyz"])


def test_the_server_serves_a_reference_but_never_imports_one_a_client_names(workdir: Path) -> None:
    _write(workdir / "served_env.py", "ServedEnv")
    _write(workdir / "other_env.py", "OtherEnv")
    app = create_app(ServerConfig(env_ids=["served_env.py:ServedEnv"]))
    with BackgroundServer(app) as srv, httpx.Client(base_url=srv.url, timeout=10) as http:
        ok = http.post("/episodes", json={"env_id": "served_env.py:ServedEnv"})
        assert ok.status_code == 201, ok.text
        assert ok.json()["env_id"] == resolve_env("served_env.py:ServedEnv")
        refused = http.post("/episodes", json={"env_id": "other_env.py:OtherEnv"})
        assert refused.status_code == 404
        assert (
            "is not served here (a class reference is served only when the server is started with it)"
            in (refused.json()["detail"])
        )
    assert not [m for m in sys.modules if m.endswith("_other_env")]
