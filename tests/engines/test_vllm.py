"""VLLMEngine against a real vLLM server (CPU build, its own environment: scripts/setup.sh --vllm).

One server serves the whole module (starting one takes about a minute on two cores). Without
vLLM set up these tests skip with the reason, unless AGENTRL_REQUIRE_VLLM=1 (CI sets it), when
a missing vLLM is a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from agentrl.engines.checker import check_engine, check_sampling
from agentrl.engines.errors import EngineUnavailableError, WeightUpdateError
from agentrl.engines.launcher import EngineServer, launch_vllm_server
from agentrl.engines.protocol import Generation, run_sync
from agentrl.engines.vllm import VLLMEngine
from agentrl.engines.weights import load_safetensors_dir
from agentrl.models import load_model, load_tokenizer, resolve
from agentrl.trainer.weight_sync import save_weights_dir
from agentrl.types import SamplingParams

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    srv = launch_vllm_server(resolve("tiny"), log_path=log, startup_timeout_s=600)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def engine(server: EngineServer) -> Iterator[VLLMEngine]:
    eng = VLLMEngine(server.base_url, resolve("tiny"), max_context=4096)
    yield eng
    run_sync(
        eng.update_weights_from_path(resolve("tiny"), version=0), timeout_s=120, what="restoring the weights"
    )
    eng.close()


def _perturbed(path: Path, seed: int, scale: float = 0.05) -> torch.nn.Module:
    """The tiny model with every weight (the tied embedding too) moved; saved at ``path``."""
    model = load_model(resolve("tiny")).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    save_weights_dir(model.state_dict(), path)
    return model


def _teacher_forced(model: torch.nn.Module, prompt: list[int], g: Generation) -> list[float]:
    ids = torch.tensor([prompt + g.output_ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0].float(), -1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(g.output_ids)]


def test_check_engine_passes_on_vllm(engine: VLLMEngine) -> None:
    ref = load_model(resolve("tiny")).float().eval()
    report = check_engine(
        engine,
        vocab_size=engine.vocab_size,
        max_context=4096,
        reference=ref,
        checkpoint=resolve("tiny"),
        sampling_draws=0,  # test_vllm_samples_from_the_distribution_it_reports, on a peaked model
    )
    assert set(report.passed) >= {"generation", "seed", "stop", "bad-input", "logprobs", "abort", "deadline"}
    assert "versions[checkpoint]" in report.passed


def test_vllm_samples_from_the_distribution_it_reports(engine: VLLMEngine, tmp_path: Path) -> None:
    """check_engine's sampling check: seeded draws at T=1 and T=0.7 follow the trainer's probabilities.

    tiny's next-token distribution is nearly uniform (7.2 nats; ln 1472 = 7.3), where a wrong
    temperature hardly moves the frequencies. Its final norm scaled by 6 scales the logits by 6:
    5.3 nats at T=1, 3.3 at T=0.7 after the check's prompt.
    """
    peaked = load_model(resolve("tiny")).float().eval()
    with torch.no_grad():
        peaked.model.norm.weight.mul_(6.0)
    save_weights_dir(peaked.state_dict(), tmp_path / "peaked")
    run_sync(engine.update_weights_from_path(tmp_path / "peaked"), timeout_s=120, what="update")
    settings = [{"temperature": 1.0}, {"temperature": 0.7}]
    report = check_sampling(
        engine, peaked, vocab_size=engine.vocab_size, draws=1000, settings=settings, timeout_s=300
    )
    assert report.passed == ["sampling[T=1.0]", "sampling[T=0.7]"]
    assert len(report.sampling) == 4 and all(r.dof >= 5 for r in report.sampling.values()), report.sampling


def test_tokens_after_an_update_score_under_the_new_weights(engine: VLLMEngine, tmp_path: Path) -> None:
    new = _perturbed(tmp_path / "w1", seed=1)
    prompt = [5, 6, 7, 8, 9]
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=3)
    before = run_sync(engine.generate(prompt, params), timeout_s=60, what="generate")
    version = run_sync(engine.update_weights_from_path(tmp_path / "w1"), timeout_s=120, what="update")
    assert version == engine.weight_version == before.weight_version + 1
    after = run_sync(engine.generate(prompt, params), timeout_s=60, what="generate")
    assert after.weight_versions == [version] * len(after.output_ids)
    diff = max(abs(a - b) for a, b in zip(_teacher_forced(new, prompt, after), after.logprobs, strict=True))
    assert diff < 1e-4, f"tokens after the update do not score under the new weights (max |dlogp| {diff})"
    old = load_model(resolve("tiny")).float().eval()
    stale = max(abs(a - b) for a, b in zip(_teacher_forced(old, prompt, after), after.logprobs, strict=True))
    assert stale > 1e-2  # the check above can tell the two models apart


@pytest.mark.timeout(600)  # a 1,500-token request; about 4 minutes with the server's start on two busy cores
def test_an_update_mid_request_leaves_no_kv_of_the_old_weights(engine: VLLMEngine, tmp_path: Path) -> None:
    """An update while a request runs: that request's tokens go old version then new, and its new
    ones, like every token of a request sent after the update with a long prefix shared with
    earlier requests (an agent's system and tool prompt), score under the new weights: no KV
    computed by the old weights is reused, though the shared prefix was served from the cache."""
    new = _perturbed(tmp_path / "w2", seed=2)
    shared = [10 + (7 * i) % 1400 for i in range(300)]  # more than two KV blocks (128 tokens each on CPU)
    quick = SamplingParams(max_new_tokens=8, temperature=1.0, seed=6)
    long = SamplingParams(max_new_tokens=1500, temperature=1.0, seed=4, ignore_eos=True)

    async def run() -> tuple[Generation, list[Generation], Generation, int]:
        await engine.generate(shared + [1], quick)
        t0 = time.monotonic()
        hit = await engine.generate(shared + [2], quick)
        eight = time.monotonic() - t0  # a cached prefix and 8 tokens, at this machine's present speed
        task = asyncio.create_task(engine.generate(shared + [3], long))
        await asyncio.sleep(max(1.5, 3 * eight))  # ~24 tokens in, however busy the machine: mid-request
        assert not task.done()
        v = await engine.update_weights_from_path(tmp_path / "w2")
        after = [await engine.generate(shared + [4 + i], quick) for i in range(2)]
        return hit, after, await task, v

    hit, after, g, v = run_sync(run(), timeout_s=300, what="requests across an update")
    assert hit.meta["cached_tokens"] >= 256  # before the update the shared prefix comes from the cache
    versions = g.weight_versions
    assert len(g.output_ids) == 1500 and g.finish_reason == "length"
    assert versions == sorted(versions) and versions[0] == v - 1 and versions[-1] == v
    k = versions.index(v)
    scored = _teacher_forced(new, shared + [3], g)
    diff = max(abs(a - b) for a, b in zip(scored[k:], g.logprobs[k:], strict=True))
    assert diff < 1e-3, f"the frozen request's tokens after the update used KV of the old weights ({diff})"
    for i, a in enumerate(after):
        assert a.weight_versions == [v] * len(a.output_ids)
        diff = max(
            abs(x - y) for x, y in zip(_teacher_forced(new, shared + [4 + i], a), a.logprobs, strict=True)
        )
        assert diff < 1e-4, f"a request after the update reused KV of the old weights (max |dlogp| {diff})"
    assert after[1].meta["cached_tokens"] >= 256  # the new version's requests share their prefixes again


def test_a_rejected_update_keeps_the_old_weights_and_version(engine: VLLMEngine, tmp_path: Path) -> None:
    prompt, greedy = [4, 5, 6], SamplingParams(max_new_tokens=12, temperature=0.0)
    before = run_sync(engine.generate(prompt, greedy), timeout_s=60, what="generate")
    version = engine.weight_version
    bad = load_safetensors_dir(Path(resolve("tiny")))
    name = next(n for n in bad if n.endswith("mlp.up_proj.weight"))
    bad[name] = torch.zeros(bad[name].shape[0] + 1, bad[name].shape[1])
    save_weights_dir(bad, tmp_path / "bad")
    with pytest.raises(WeightUpdateError, match=f"{name}.*nothing was changed"):
        run_sync(engine.update_weights_from_path(tmp_path / "bad"), timeout_s=120, what="update")
    partial = {n: t for n, t in load_safetensors_dir(Path(resolve("tiny"))).items() if "layers.0." in n}
    save_weights_dir(partial, tmp_path / "partial")
    with pytest.raises(WeightUpdateError, match="missing tensors"):
        run_sync(engine.update_weights_from_path(tmp_path / "partial"), timeout_s=120, what="update")
    after = run_sync(engine.generate(prompt, greedy), timeout_s=60, what="generate")
    assert engine.weight_version == version and after.weight_versions == [version] * len(after.output_ids)
    assert after.output_ids == before.output_ids and after.logprobs == pytest.approx(
        before.logprobs, abs=1e-5
    )


def test_broadcast_sync_over_gloo_into_vllm(engine: VLLMEngine, tmp_path: Path) -> None:
    """run.weight_sync='broadcast': buckets over a gloo group into vLLM's worker, applied at once."""
    from agentrl.trainer.errors import WeightSyncError
    from agentrl.trainer.weight_sync import BroadcastSync

    new = _perturbed(tmp_path / "w3", seed=3)
    sync = BroadcastSync(engine, bucket_bytes=1 << 20, timeout_s=60)  # several buckets, one commit
    try:
        res = sync.push(new.state_dict())
        assert res.buckets > 1 and res.version == engine.weight_version
        prompt, params = [7, 8, 9], SamplingParams(max_new_tokens=24, temperature=1.0, seed=5)
        g = run_sync(engine.generate(prompt, params), timeout_s=60, what="generate")
        assert g.weight_versions == [res.version] * len(g.output_ids)
        diff = max(abs(a - b) for a, b in zip(_teacher_forced(new, prompt, g), g.logprobs, strict=True))
        assert diff < 1e-4, f"tokens after a broadcast update do not score under the new weights ({diff})"
        bad = dict(new.state_dict())
        bad.pop(next(n for n in bad if n.endswith("mlp.down_proj.weight")))
        with pytest.raises(WeightSyncError, match="tensors never sent"):
            sync.push(bad)
        assert engine.weight_version == res.version
        again = run_sync(engine.generate(prompt, params), timeout_s=60, what="generate")
        assert again.output_ids == g.output_ids  # the rejected push changed nothing
        with pytest.raises(WeightUpdateError, match="'nccl' needs a vLLM worker on a CUDA GPU"):  # at once
            run_sync(engine.init_weights_update_group("127.0.0.1", 9, 1, 2, "probe", "nccl", 5.0), timeout_s=60,
                     what="joining over NCCL")  # fmt: skip
    finally:
        sync.close()


def test_a_sleeping_vllm_refuses_work_and_wakes_to_the_same_weights(engine: VLLMEngine) -> None:
    """--colocate's calls on the real server: asleep, it says so and this client refuses to generate
    or update (at once, not a request hanging on a paused scheduler); awake, the same greedy tokens."""
    prompt, greedy = [4, 5, 6], SamplingParams(max_new_tokens=8, temperature=0.0)
    before = run_sync(engine.generate(prompt, greedy), timeout_s=60, what="generate")
    run_sync(engine.sleep(1), timeout_s=120, what="sleep")
    try:
        assert run_sync(engine.is_sleeping(), timeout_s=30, what="is_sleeping") is True
        with pytest.raises(EngineUnavailableError, match="sleeps"):
            run_sync(engine.generate(prompt, greedy), timeout_s=60, what="generate")
        with pytest.raises(EngineUnavailableError, match="sleeps"):
            run_sync(engine.update_weights_from_path(resolve("tiny")), timeout_s=60, what="update")
    finally:
        run_sync(engine.wake_up(), timeout_s=120, what="wake")
    assert run_sync(engine.is_sleeping(), timeout_s=30, what="is_sleeping") is False
    after = run_sync(engine.generate(prompt, greedy), timeout_s=60, what="generate")
    assert after.output_ids == before.output_ids and engine.stats["sleeps"] == engine.stats["wakes"] == 1


def test_session_ledger_over_vllm_keeps_the_sampled_tokens(engine: VLLMEngine) -> None:
    """A multi-turn episode with tools through the OpenAI SDK: the trajectory holds exactly vLLM's tokens."""
    openai = pytest.importorskip("openai")
    from agentrl.httpkit import BackgroundServer
    from agentrl.session.manager import SessionManager
    from agentrl.session.server import create_app

    returned: list[Generation] = []
    real = engine.generate

    async def spy(*args: Any, **kwargs: Any) -> Generation:
        g = await real(*args, **kwargs)
        returned.append(g)
        return g

    engine.generate = spy  # type: ignore[method-assign]
    tokenizer = load_tokenizer("tiny")
    manager = SessionManager(tokenizer, engine, model_name="tiny")
    tools = [{"type": "function", "function": {"name": "calculate", "description": "evaluate arithmetic",
              "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]  # fmt: skip
    with BackgroundServer(create_app(manager, default_max_tokens=16)) as srv:
        sid = str(httpx.post(f"{srv.url}/sessions", timeout=30).json()["id"])
        client = openai.OpenAI(
            base_url=f"{srv.url}/sessions/{sid}/v1", api_key="unused", max_retries=0, timeout=60
        )
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 3 + 4? Use the tool."}]
        for turn in range(3):
            r = client.chat.completions.create(model="tiny", messages=messages, tools=tools, max_tokens=16,  # type: ignore[arg-type]
                                               temperature=1.0, seed=turn)  # fmt: skip
            messages.append(r.choices[0].message.model_dump(exclude_none=True))
            messages.append({"role": "user", "content": f"Result {turn}: 7. Again."})
        traj = run_sync(manager.trajectories(sid), timeout_s=30, what="trajectory")
    assert len(returned) == 3
    segments = traj
    sampled = [t for s in segments for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m]
    assert sampled == [t for g in returned for t in g.output_ids]
    logprobs = [lp for s in segments for lp, m in zip(s.rollout_logprobs, s.loss_mask, strict=True) if m]
    assert logprobs == pytest.approx([lp for g in returned for lp in g.logprobs])
    versions = [v for s in segments for v, m in zip(s.policy_versions, s.loss_mask, strict=True) if m]
    assert versions == [v for g in returned for v in g.weight_versions]


def test_vllm_streams_tokens_as_it_samples_them_exactly_as_it_generates(engine: VLLMEngine) -> None:
    """``generate_stream``: several deltas (not one at the end), whose concatenation, logprobs and
    versions equal a seeded ``generate`` of the same request; a streamed chat turn through the
    session server reaches the client in more than one chunk; closing a stream early aborts the
    request on the server (the engine keeps serving)."""
    from agentrl.engines.protocol import TokenDelta

    prompt = load_tokenizer("tiny").encode("Count to twenty: one, two, three,")
    sp = SamplingParams(max_new_tokens=48, temperature=1.0, seed=7, ignore_eos=True)

    async def both() -> tuple[list[Any], Generation]:
        items = [item async for item in engine.generate_stream(prompt, sp)]
        return items, await engine.generate(prompt, sp)

    items, plain = run_sync(both(), timeout_s=120, what="streamed and plain generation")
    deltas, final = [i for i in items if isinstance(i, TokenDelta)], items[-1]
    assert isinstance(final, Generation) and len(deltas) > 1
    assert [t for d in deltas for t in d.output_ids] == final.output_ids == plain.output_ids
    assert final.logprobs == pytest.approx(plain.logprobs, abs=1e-4)
    assert final.weight_versions == plain.weight_versions and final.finish_reason == "length"

    # through the session server: a streamed chat turn reaches the client in several chunks
    openai = pytest.importorskip("openai")
    from agentrl.httpkit import BackgroundServer
    from agentrl.session.manager import SessionManager
    from agentrl.session.server import create_app

    manager = SessionManager(load_tokenizer("tiny"), engine, model_name="tiny")
    with BackgroundServer(create_app(manager, default_max_tokens=48)) as srv:
        sid = str(httpx.post(f"{srv.url}/sessions", timeout=30).json()["id"])
        client = openai.OpenAI(
            base_url=f"{srv.url}/sessions/{sid}/v1", api_key="x", max_retries=0, timeout=60
        )
        chunks = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Count to twenty."}], max_tokens=48,
            temperature=1.0, seed=3, stream=True,
        )  # fmt: skip
        texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) > 1

    async def close_early() -> Generation:
        stream = engine.generate_stream(prompt, SamplingParams(max_new_tokens=3000, ignore_eos=True))
        async for item in stream:
            assert isinstance(item, TokenDelta)
            break
        await stream.aclose()  # the client went away: the server aborts the request
        return await engine.generate(prompt, SamplingParams(max_new_tokens=4))

    t0 = time.monotonic()
    after = run_sync(close_early(), timeout_s=120, what="a stream closed early")
    assert len(after.output_ids) == 4 and time.monotonic() - t0 < 60  # not queued behind 3000 tokens


@pytest.mark.usefixtures("vllm_python")
def test_kill_9_of_the_launcher_leaves_no_engine_process(tmp_path: Path) -> None:
    script = tmp_path / "owner.py"
    script.write_text(
        "import os, sys, time\n"
        "from agentrl.engines.launcher import launch_vllm_server\n"
        "if __name__ == '__main__':\n"
        f"    s = launch_vllm_server({resolve('tiny')!r}, startup_timeout_s=600)\n"
        "    print(s.process.pid, flush=True)\n"
        "    time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        reaper = int(owner.stdout.readline())  # type: ignore[union-attr]
        group = _children(reaper)
        assert group, "the engine server started no process"
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (alive := [p for p in [reaper, *group] if _alive(p)]):
            time.sleep(0.5)
        assert not alive, f"processes left behind after kill -9 of their owner: {alive}"
    finally:
        if owner.poll() is None:
            owner.kill()


def _vllm_pids() -> set[int]:
    """Live vLLM processes: API servers and the engine cores / workers they name ``VLLM::...``."""
    out = subprocess.run(["pgrep", "-f", "vllm.entrypoints|VLLM::"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split() if _alive(int(p))}


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    kids = [int(p) for p in out]
    return kids + [g for k in kids for g in _children(k)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.timeout(1800)  # the whole demo: about 7 minutes on two cores, with the server's start
@pytest.mark.usefixtures("vllm_python")
def test_train_countdown_on_vllm_learns(tmp_path: Path) -> None:
    """`agentrl train --env countdown --engine vllm`, the README's command: the train reward rises, the server is gone after."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", "countdown", "--engine", "vllm",
           "--run-dir", str(run), "--no-progress", "--no-tensorboard"]  # fmt: skip
    before = _vllm_pids()  # the module's own server runs beside this test
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_start"] is not None and summary["eval_end"] is not None
    assert (run / "engine-rank0.log").stat().st_size > 0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # Learning, judged on the train reward (10 steps x 128 sampled episodes each end): the greedy
    # eval on 64 seeds swings by +-0.2 between evals on this engine (README, "Roll out on vLLM").
    train = [m["rollout/reward"] for m in metrics if m["kind"] == "train"]
    first, last = sum(train[:10]) / 10, sum(train[-10:]) / 10
    assert last > first, f"the train reward did not rise on vLLM: {first:.3f} -> {last:.3f}"
    assert [m["sync/version"] for m in metrics if m["kind"] == "train"][-1] == 50  # every update reached vLLM
    mismatch = [m["train/mismatch_abs_logp"] for m in metrics if "train/mismatch_abs_logp" in m]
    assert len(mismatch) == 50 and all(0.0 <= x < 0.05 for x in mismatch), mismatch
    deadline = time.monotonic() + 20  # the group's last processes may still be exiting
    while (left := _vllm_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"vLLM processes the run started and left behind: {sorted(left)}"


def test_async_training_on_vllm_keeps_the_bound_and_trains_every_task_once(
    engine: VLLMEngine, server: EngineServer, tmp_path: Path
) -> None:
    """`--max-staleness 1 --overprovision 2` on the module's vLLM server: updates land while
    episodes are in flight, no trained token is more than one version old, no task is lost."""
    from agentrl.cli import main
    from agentrl.trainer.metrics import read_jsonl

    run = tmp_path / "run"
    argv = ["train", "--env", "countdown", "--engine", "vllm", "--engine-url", server.base_url,
            "--steps", "3", "--tasks-per-step", "4", "--group-size", "4", "--max-new-tokens", "24",
            "--eval-episodes", "4", "--sft-steps", "0", "--max-staleness", "1", "--overprovision", "2",
            "--run-dir", str(run), "--no-progress", "--no-tensorboard"]  # fmt: skip
    assert main(argv) == 0
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["sync/version"] for r in rows] == [1.0, 2.0, 3.0]  # every update reached vLLM
    lags = [r["train/staleness_max"] for r in rows]
    assert max(lags) == 1.0 and all(x <= 1.0 for x in lags), lags  # async, within the bound
    assert all(r["rollout/episodes_infra_error"] == 0 for r in rows)
    tasks = [t for r in read_jsonl(run / "tasks.jsonl") for t in r["tasks"]]
    assert len(tasks) == len(set(tasks)) >= 12  # every trained task once (carried-over groups too)


def test_training_at_temperature_0_7_on_vllm_starts_on_policy(
    engine: VLLMEngine, server: EngineServer, tmp_path: Path
) -> None:
    """`--temperature 0.7` on vLLM: vLLM reports logprobs of softmax(z / 0.7) and the trainer scores
    the same distribution, so the first update's ratio is 1 up to the engines' rounding and nothing clips."""
    from agentrl.cli import main
    from agentrl.trainer.metrics import read_jsonl

    # a reward even for random weights, so the advantages are not 0 and the clip has tokens to act on
    vowels = Path(__file__).parents[1] / "trainer" / "_dense_env.py"
    run = tmp_path / "run"
    argv = ["train", "--env", f"{vowels}:VowelEnv", "--engine", "vllm", "--engine-url", server.base_url,
            "--steps", "1", "--tasks-per-step", "2", "--group-size", "4", "--max-new-tokens", "16",
            "--eval-episodes", "2", "--sft-steps", "0", "--temperature", "0.7", "--clip-low", "0.01",
            "--clip-high", "0.01", "--run-dir", str(run), "--no-progress", "--no-tensorboard"]  # fmt: skip
    assert main(argv) == 0
    (row,) = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert row["train/tokens"] > 0 and row["algo/zero_adv_frac"] < 1
    assert row["train/mismatch_abs_logp"] < 1e-5, row  # 0.099 when the trainer scored log_softmax(z)
    assert row["train/clip_frac"] == 0.0, row


def test_a_run_on_a_server_holding_other_weights_pushes_its_start_weights(
    engine: VLLMEngine, server: EngineServer, tmp_path: Path
) -> None:
    """`--engine-url` with no warm start and no resume: the server may hold any weights (another run's,
    another checkpoint), so the run pushes its own start weights as version 0 before the first rollout."""
    from agentrl.cli import main
    from agentrl.trainer.metrics import read_jsonl

    _perturbed(tmp_path / "other", seed=4)
    run_sync(engine.update_weights_from_path(tmp_path / "other", version=7), timeout_s=120, what="update")
    vowels = Path(__file__).parents[1] / "trainer" / "_dense_env.py"
    run = tmp_path / "run"
    argv = ["train", "--env", f"{vowels}:VowelEnv", "--engine", "vllm", "--engine-url", server.base_url,
            "--steps", "1", "--tasks-per-step", "2", "--group-size", "2", "--max-new-tokens", "8",
            "--eval-episodes", "2", "--sft-steps", "0", "--run-dir", str(run), "--no-progress",
            "--no-tensorboard"]  # fmt: skip
    assert main(argv) == 0
    (row,) = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert row["train/tokens"] > 0
    assert row["train/mismatch_abs_logp"] < 1e-5, row  # the other weights' tokens: ~0.1 when not pushed
    assert row["sync/version"] == 1.0  # version 0 = the start weights, 1 = after the update


def test_serve_session_engine_flags_reach_vllm(server: EngineServer) -> None:
    from agentrl.errors import ConfigError
    from agentrl.session.commands import build_manager

    manager, started = build_manager("tiny", server.base_url, engine_kind="vllm")
    assert started is None and isinstance(manager.engine, VLLMEngine)
    assert manager.engine.base_url == server.base_url
    with pytest.raises(ConfigError, match="say which server it is"):
        build_manager("tiny", server.base_url, engine_kind="hf")
