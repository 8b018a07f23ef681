"""Weight sync: each transport lands the trainer's exact tensors in a real engine and bumps the version once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _tiny import tiny_model  # noqa: E402

from agentrl.engines import run_sync  # noqa: E402
from agentrl.engines.hf import HFEngine  # noqa: E402
from agentrl.trainer.errors import WeightSyncError  # noqa: E402
from agentrl.trainer.weight_sync import BroadcastSync, DiskSync, InProcessSync  # noqa: E402


def _new_weights() -> dict[str, torch.Tensor]:
    """A trainer's state dict, tied embeddings sharing storage as they do in a real model."""
    return tiny_model(seed=7).state_dict()


@pytest.mark.parametrize("kind", ["inprocess", "disk", "broadcast"])
def test_sync_copies_weights_and_bumps_version(kind, tmp_path):
    engine = HFEngine(tiny_model(), device="cpu", prefix_cache_bytes=0)
    try:
        if kind == "inprocess":
            sync = InProcessSync(engine)
        elif kind == "disk":
            sync = DiskSync(engine, tmp_path / "w")
        else:
            sync = BroadcastSync(engine, bucket_bytes=20_000)  # several buckets for this model
        new = _new_weights()
        res = sync.push(new)
        assert res.version == 1 == engine.weight_version and res.seconds > 0 and res.bytes > 0
        if kind == "broadcast":
            assert res.buckets > 1
        for k, v in engine.model.state_dict().items():
            torch.testing.assert_close(v, new[k], rtol=0, atol=0, msg=k)
        gen = run_sync(
            engine.generate([1, 2, 3], {"max_new_tokens": 3, "temperature": 0.0}),
            timeout_s=30,
            what="generate",
        )
        assert set(gen.weight_versions) == {1}
        assert sync.push(new).version == 2
        sync.close()
    finally:
        engine.close()


def test_rejected_update_keeps_old_weights_and_version():
    engine = HFEngine(tiny_model(), device="cpu", prefix_cache_bytes=0)
    try:
        before = {k: v.clone() for k, v in engine.model.state_dict().items()}
        bad = dict(_new_weights())
        bad["model.embed_tokens.weight"] = torch.zeros(3, 3)
        with pytest.raises(WeightSyncError, match="version 1 failed"):
            InProcessSync(engine).push(bad)
        assert engine.weight_version == 0
        for k, v in engine.model.state_dict().items():
            assert torch.equal(v, before[k])
    finally:
        engine.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal a machine without a GPU gives")
def test_a_broadcast_over_nccl_without_a_gpu_is_refused_before_any_rendezvous():
    from agentrl.trainer.weight_sync import make_sync

    engine = HFEngine(tiny_model(), device="cpu", prefix_cache_bytes=0)
    try:
        with pytest.raises(WeightSyncError, match="NCCL needs the trainer on a CUDA GPU; use backend='gloo'"):
            BroadcastSync(engine, backend="nccl", timeout_s=5)
        sync = make_sync("broadcast", engine, "unused", device="cpu")  # a CPU trainer broadcasts over gloo
        assert isinstance(sync, BroadcastSync) and sync.backend == "gloo"
        sync.close()
    finally:
        engine.close()


def test_ipc_sync_needs_a_vllm_engine_and_a_gpu():
    """``--weight-sync ipc`` is refused when it is built: an engine that takes no IPC handles, or (on a
    machine without a GPU) a trainer with no GPU memory to share."""
    from agentrl.engines.errors import UnsupportedWeightUpdateError
    from agentrl.engines.vllm import VLLMEngine
    from agentrl.models import resolve
    from agentrl.trainer.weight_sync import make_sync

    engine = HFEngine(tiny_model(), device="cpu", prefix_cache_bytes=0)
    try:
        with pytest.raises(
            UnsupportedWeightUpdateError, match="ipc' needs a vLLM engine on the trainer's GPU"
        ):
            make_sync("ipc", engine, "unused")
    finally:
        engine.close()
    if torch.cuda.is_available():
        return
    vllm = VLLMEngine("http://127.0.0.1:9", resolve("tiny"), retries=0)  # a client: no server is reached
    with pytest.raises(WeightSyncError, match="this trainer has no CUDA GPU; use --weight-sync disk"):
        make_sync("ipc", vllm, "unused")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC shares GPU memory: needs a CUDA GPU")
def test_ipc_handles_open_in_another_process_to_the_same_values():
    import subprocess

    from agentrl.trainer.ipc_sync import ipc_handles

    t = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4) * 0.5
    payload = ipc_handles({"w": t})
    torch.cuda.synchronize()
    reader = (
        "import base64, pickle, sys, torch\n"
        "from torch.multiprocessing.reductions import rebuild_cuda_tensor\n"
        "(h,) = pickle.loads(base64.b64decode(sys.stdin.read()))\n"
        "(args,) = h.values()\n"
        "print(rebuild_cuda_tensor(*args).cpu().tolist())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", reader], input=payload, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert eval(out.stdout) == t.cpu().tolist()  # noqa: S307 (the child's own print of a list of floats)
