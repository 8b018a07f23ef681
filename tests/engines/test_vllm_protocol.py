"""VLLMEngine's weight-update protocol and vLLM's launch command, against a stub server (no vLLM needed).

The stub records every call and answers as vLLM 0.32 does: ``/reset_prefix_cache`` answers
200 with ``{"success": bool}``, and ``success`` is false while requests hold KV blocks unless
``reset_running_requests`` preempts them first. tests/engines/test_vllm.py checks the same on a
real server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request

from agentrl.engines import run_sync
from agentrl.engines.errors import EngineUnavailableError, WeightUpdateError
from agentrl.engines.launcher import vllm_command
from agentrl.engines.vllm import VLLMEngine
from agentrl.httpkit import BackgroundServer
from agentrl.models import resolve
from agentrl.types import SamplingParams


class Stub:
    """vLLM's routes as an RL update uses them; ``held`` says whether requests hold KV blocks."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str], Any]] = []
        self.held = True
        self.refuse_reset = False

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/{path:path}")
        async def any_post(path: str, request: Request) -> dict[str, Any]:
            body = await request.json() if await request.body() else None
            self.calls.append(("/" + path, dict(request.query_params), body))
            if path == "inference/v1/generate":
                choice = {
                    "token_ids": [5],
                    "finish_reason": "length",
                    "logprobs": {"content": [{"logprob": -1.0}]},
                }
                return {"choices": [choice], "usage": {"prompt_tokens": 3}}
            if path == "reset_prefix_cache":
                preempt = request.query_params.get("reset_running_requests") == "true"
                return {"success": not self.refuse_reset and (preempt or not self.held)}
            return {}

        return app

    def paths(self) -> list[str]:
        return [p for p, _, _ in self.calls if p != "/inference/v1/generate"]

    def salts(self) -> list[str | None]:
        return [b.get("cache_salt") for p, _, b in self.calls if p == "/inference/v1/generate"]


@pytest.fixture
def stub() -> Iterator[tuple[Stub, VLLMEngine]]:
    s = Stub()
    with BackgroundServer(s.app()) as srv:
        engine = VLLMEngine(srv.url, resolve("tiny"), retries=0)
        try:
            yield s, engine
        finally:
            engine.close()


def _generate(engine: VLLMEngine) -> None:
    run_sync(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=1)), timeout_s=30, what="generate")


def test_an_update_resets_the_cache_after_the_load_and_checks_it(stub: tuple[Stub, VLLMEngine]) -> None:
    s, engine = stub
    assert run_sync(engine.update_weights_from_path(resolve("tiny")), timeout_s=30, what="update") == 1
    assert s.paths() == [
        "/pause",
        "/collective_rpc",
        "/reset_prefix_cache",
        "/update_weight_version",
        "/resume",
    ]
    params = {p: q for p, q, _ in s.calls}
    assert params["/pause"] == {"mode": "keep", "clear_cache": "false"}
    # the requests frozen by the pause hold KV blocks: only a reset that preempts them succeeds
    assert params["/reset_prefix_cache"] == {"reset_running_requests": "true"}


def test_requests_after_an_update_carry_a_new_cache_salt(stub: tuple[Stub, VLLMEngine]) -> None:
    """A request sent after an update can hit no KV block cached by the weights before it."""
    s, engine = stub
    _generate(engine)
    for _ in range(2):
        run_sync(engine.update_weights_from_path(resolve("tiny")), timeout_s=30, what="update")
        _generate(engine)
        _generate(engine)
    first, a1, b1, a2, b2 = s.salts()
    assert first is None  # before this client's first update: the server's shared cache
    assert a1 is not None and a1 == b1  # one version's requests share their prefixes
    assert a2 is not None and a2 == b2 and a2 != a1
    assert all(len(x) <= 128 and not set("@/\\\0") & set(x) for x in (a1, a2))  # vLLM's rules for a salt


def test_an_update_whose_cache_reset_vllm_refuses_is_rolled_back(stub: tuple[Stub, VLLMEngine]) -> None:
    s, engine = stub
    s.refuse_reset = True
    with pytest.raises(
        WeightUpdateError, match=r"reset_prefix_cache answered \{'success': False\}.*rolled back"
    ):
        run_sync(engine.update_weights_from_path(resolve("tiny")), timeout_s=30, what="update")
    assert engine.weight_version == 0 and engine.stats["rollbacks"] == 1
    assert s.paths() == ["/pause", "/collective_rpc", "/reset_prefix_cache", "/collective_rpc", "/resume"]
    _generate(engine)
    assert s.salts() == [None]  # the old weights, and the cache they computed, serve on


def test_vllm_command_pins_vllm_sampling_defaults() -> None:
    """A model's generation_config.json (repetition_penalty, top_k, ...) never reaches RL sampling."""
    cmd = vllm_command("python", "/models/m")
    i = cmd.index("--generation-config")
    assert cmd[i + 1] == "vllm"
    assert "--enable-prompt-tokens-details" in cmd  # cached_tokens in every answer


def test_a_failed_update_after_a_weight_group_update_refuses_to_serve(stub: tuple[Stub, VLLMEngine]) -> None:
    """The weights of a weight-group update are in no file: a later update that fails must not reload the
    start checkpoint (and serve it under the current version); the client refuses to serve instead."""
    s, engine = stub
    run_sync(
        engine.init_weights_update_group("127.0.0.1", 9, 1, 2, "g", "gloo", 5.0), timeout_s=30, what="join"
    )
    names = sorted(engine._manifest)
    shapes = [list(engine._manifest[n]) for n in names]
    run_sync(engine.update_weights_from_distributed(names, ["float32"] * len(names), shapes, group_name="g"),
             timeout_s=30, what="group update")  # fmt: skip
    assert engine.weight_version == 1
    s.refuse_reset = True
    with pytest.raises(EngineUnavailableError, match="no file holds the weights served before it"):
        run_sync(engine.update_weights_from_path(resolve("tiny")), timeout_s=30, what="update")
    # the start checkpoint was not reloaded, and the server stays paused: no "/resume" after the reset
    assert s.paths()[-3:] == ["/pause", "/collective_rpc", "/reset_prefix_cache"]
    assert engine.weight_version == 1
    with pytest.raises(EngineUnavailableError, match="restart the server"):
        _generate(engine)


def _ipc_update(
    engine: VLLMEngine, names: list[str] | None = None, shapes: list[list[int]] | None = None
) -> int:
    names = names if names is not None else sorted(engine._manifest)
    shapes = shapes if shapes is not None else [list(engine._manifest[n]) for n in names]
    coro = engine.update_weights_from_ipc(names, ["float32"] * len(names), shapes, "aGFuZGxlcw==")
    return run_sync(coro, timeout_s=30, what="ipc update")


def test_an_ipc_update_goes_through_vllms_transfer_routes_under_pause_and_version(
    stub: tuple[Stub, VLLMEngine],
) -> None:
    """vLLM's IPC backend is initialised once; every update is start / update / finish inside the usual
    pause, checked cache reset, version and resume; the handles go as they were given."""
    s, engine = stub
    assert _ipc_update(engine) == 1
    assert _ipc_update(engine) == 2
    update = ["/start_weight_update", "/update_weights", "/finish_weight_update", "/reset_prefix_cache",
              "/update_weight_version", "/resume"]  # fmt: skip
    assert s.paths() == ["/init_weight_transfer_engine", "/pause", *update, "/pause", *update]
    bodies = {p: b for p, _, b in s.calls}
    assert bodies["/init_weight_transfer_engine"] == {"init_info": {"packed": False}}
    info = bodies["/update_weights"]["update_info"]
    assert info["names"] == sorted(engine._manifest)
    assert info["shapes"] == [list(engine._manifest[n]) for n in info["names"]]
    assert info["ipc_handles_pickled"] == "aGFuZGxlcw==" and set(info) == {
        "names", "dtype_names", "shapes", "ipc_handles_pickled"}  # fmt: skip
    assert bodies["/update_weight_version"] == {"new_version": "2"}


@pytest.mark.parametrize("fault", ["missing", "shape", "unknown"])
def test_an_ipc_update_that_does_not_match_the_served_model_is_refused_before_the_server_sees_it(
    stub: tuple[Stub, VLLMEngine], fault: str
) -> None:
    s, engine = stub
    names = sorted(engine._manifest)
    shapes = [list(engine._manifest[n]) for n in names]
    if fault == "missing":
        names, shapes = names[1:], shapes[1:]
    elif fault == "shape":
        shapes[0] = [shapes[0][0] + 1, *shapes[0][1:]]
    else:
        names, shapes = [*names, "model.extra.weight"], [*shapes, [2, 2]]
    with pytest.raises(WeightUpdateError, match="IPC weight update rejected.*nothing was changed"):
        _ipc_update(engine, names, shapes)
    assert s.paths() == [] and engine.weight_version == 0 and engine.stats["rejected_updates"] == 1
    _generate(engine)  # it serves on


def test_a_failed_update_after_an_ipc_update_refuses_to_serve(stub: tuple[Stub, VLLMEngine]) -> None:
    """No file holds weights that came over IPC: a later failed update leaves the server paused."""
    s, engine = stub
    assert _ipc_update(engine) == 1
    s.refuse_reset = True
    with pytest.raises(EngineUnavailableError, match="no file holds the weights served before it"):
        _ipc_update(engine)
    assert s.paths()[-1] == "/reset_prefix_cache" and engine.weight_version == 1
    with pytest.raises(EngineUnavailableError, match="restart the server"):
        _generate(engine)


def test_vllm_is_launched_for_ipc_updates_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ipc_weights`` adds vLLM's IPC transfer backend and lets it read pickled handles; nothing else does."""
    from agentrl.engines import launcher

    seen: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(launcher, "find_vllm_python", lambda python=None: "python")
    monkeypatch.setattr(launcher, "launch_server", lambda cmd, url, env, **kw: seen.append((cmd, env)))
    launcher.launch_vllm_server("/models/m", port=1, ipc_weights=True)
    launcher.launch_vllm_server("/models/m", port=1)
    (ipc_cmd, ipc_env), (cmd, env) = seen
    i = ipc_cmd.index("--weight-transfer-config")
    assert json.loads(ipc_cmd[i + 1]) == {"backend": "ipc"}
    assert ipc_env["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    assert "--weight-transfer-config" not in cmd and "VLLM_ALLOW_INSECURE_SERIALIZATION" not in env
