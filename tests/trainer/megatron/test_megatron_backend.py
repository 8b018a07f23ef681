"""The Megatron backend against the HF model and the FSDP2 backend, on CPU (gloo, 2 processes)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core is a dev dependency (pip install -e '.[dev]')")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _tiny import fixed_batch, tiny_model  # noqa: E402

from agentrl.trainer.errors import BackendError  # noqa: E402
from agentrl.trainer.megatron.convert import hf_to_stage, stage_to_hf  # noqa: E402
from agentrl.trainer.megatron.model import layout  # noqa: E402

WORKER = Path(__file__).with_name("_mg_worker.py")


def _qwen3(tied: bool = False):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(3)
    cfg = Qwen3Config(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                      tie_word_embeddings=tied)  # fmt: skip
    return Qwen3ForCausalLM(cfg).float()


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(4)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM(cfg).float()


@pytest.mark.parametrize("make", [lambda: tiny_model(layers=4), lambda: _qwen3(), lambda: _qwen3(True), _llama],
                         ids=["qwen2-tied", "qwen3", "qwen3-tied", "llama"])  # fmt: skip
@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_weights_round_trip_exactly_through_every_shard(make, tp, pp):
    hf = make()
    w = {k: v.detach() for k, v in hf.state_dict().items()}
    lay = layout(hf.config, tp, pp)
    back = {}
    for stage in range(pp):
        back |= stage_to_hf([hf_to_stage(w, lay, r, stage) for r in range(tp)], lay, stage)
    if lay.tied:
        w.pop("lm_head.weight", None)
    assert back.keys() == w.keys()
    for k in w:
        assert torch.equal(back[k], w[k]), k


@pytest.fixture
def one_process():
    """The Megatron backend in this process makes a world of one; leave none behind for other tests."""
    yield
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def test_one_process_matches_the_hf_model(one_process):
    """tp = pp = 1 in this process: the converted model's logprobs equal HF's (temperature 0.7)."""
    from agentrl.trainer.algorithm import RLObjective
    from agentrl.trainer.config import AlgoConfig, OptimConfig
    from agentrl.trainer.megatron.backend import MegatronBackend

    hf = _qwen3()
    batch = fixed_batch()
    batch.input_ids.clamp_(max=60)
    be = MegatronBackend(hf, AlgoConfig(), OptimConfig(micro_batch_tokens=40), objective=RLObjective(AlgoConfig()),
                         temperature=0.7)  # fmt: skip
    got = be.logprobs(batch)
    want = _hf_logprobs(hf, batch, 0.7)
    real = batch.attention_mask[:, 1:] > 0
    assert (got[:, 1:][real] - want[real]).abs().max() < 1e-5


def _hf_logprobs(hf, batch, T):
    with torch.no_grad():
        logits = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    lp = torch.log_softmax(logits[:, :-1] / T, -1)
    return lp.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)


def test_layout_refuses_what_it_cannot_split():
    cfg = tiny_model(layers=4).config
    with pytest.raises(BackendError, match="--tp 3"):
        layout(cfg, tp=3)
    with pytest.raises(BackendError, match="--pp 3"):
        layout(cfg, pp=3)
    cfg.model_type = "gpt2"
    with pytest.raises(BackendError, match="gpt2"):
        layout(cfg)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(*args: str, nproc: int = 2) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
           str(_free_port()), str(WORKER), *args]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.mark.parametrize(("tp", "pp", "nproc"), [(2, 1, 2), (1, 2, 2), (1, 1, 1)])
def test_two_ranks_score_like_the_hf_model(tmp_path, tp, pp, nproc):
    """TP = 2 (each rank half the vocabulary and heads) and PP = 2 (each rank two layers): the logits
    equal the HF model's, and every rank's own rows score as the HF model scores them, to 1e-5. And
    one torchrun process (no process group of torchrun's: the backend makes its own, in-process;
    a tcp:// one waited on torchrun's store until the timeout)."""
    out = str(tmp_path / "scores")
    _torchrun("scores", out, str(tp), str(pp), nproc=nproc)
    hf, batch = tiny_model(layers=4), fixed_batch()
    with torch.no_grad():
        hf_logits = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    real = batch.attention_mask > 0
    assert (torch.load(f"{out}.logits.pt")[real] - hf_logits[real]).abs().max() < 1e-5
    want = _hf_logprobs(hf, batch, 0.7)
    for rank in range(nproc):
        rows = list(range(rank, len(batch), nproc))
        got = torch.load(f"{out}.rank{rank}.pt")
        mine = batch.select(rows)
        assert got.shape == mine.input_ids.shape
        real = mine.attention_mask[:, 1:] > 0
        assert (got[:, 1:][real] - want[rows][real]).abs().max() < 1e-5


@pytest.mark.parametrize(
    ("tp", "pp", "family"), [(2, 1, "qwen2"), (2, 1, "qwen3"), (1, 2, "qwen2"), (1, 1, "qwen2")]
)
def test_three_grpo_steps_equal_the_fsdp2_backend(tmp_path, tp, pp, family):
    """Three GRPO steps (two mini-batches each, entropy bonus, temperature 0.7, clipping) on two ranks
    split TP = 2 (Qwen2's QKV bias; Qwen3's per-head q/k norms, whose gradients each TP rank holds a
    share of), PP = 2 or two data-parallel replicas give the one-process FSDP2 backend's stats to
    1e-4, its logprobs after each step (what the engine gets after each sync) and its final weights."""
    from safetensors.torch import load_file

    from agentrl.trainer.algorithm import make_backend

    sys.path.insert(0, str(WORKER.parent))
    from _mg_worker import ALGO, OPTIM, model, sgd

    out = str(tmp_path / "train")
    _torchrun("train", out, str(tp), str(pp), family)
    ref = make_backend(model(family), ALGO, OPTIM, temperature=0.7, optimizer_factory=sgd)
    ranks = [torch.load(f"{out}.rank{r}.pt") for r in range(2)]
    for step in range(3):
        batch = fixed_batch(seed=10 + step)
        if tp * pp == 2:  # one replica's rows: rank 0's, then rank 1's
            order = list(range(0, len(batch), 2)) + list(range(1, len(batch), 2))
        else:  # two replicas: mini-batch k is each replica's k-th half of its rows
            order = [0, 2, 1, 3, 4, 6, 5, 7]
        want = ref.train_step(batch.select(order))
        for got in (ranks[0]["stats"][step], ranks[1]["stats"][step]):
            for k in ("loss", "pg_loss", "entropy", "clip_frac", "grad_norm"):
                if k in want:
                    assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6), (step, k)
        after = ref.logprobs(batch)
        for r in range(2):
            mine = batch.select(list(range(r, len(batch), 2)))
            real = mine.attention_mask[:, 1:] > 0
            want_r = after[r::2, 1 : mine.input_ids.shape[1]]
            assert (ranks[r]["after"][step][:, 1:][real] - want_r[real]).abs().max() < 1e-5
    final = load_file(out)
    for k, v in ref.state_dict().items():
        if k == "lm_head.weight":  # tied: the embedding
            continue
        assert (final[k] - v).abs().max() < 1e-5, k


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a CPU")
def test_bf16_on_a_cpu_is_refused_with_the_reason(one_process):
    from agentrl.trainer.algorithm import RLObjective
    from agentrl.trainer.config import AlgoConfig, OptimConfig
    from agentrl.trainer.megatron.backend import MegatronBackend

    with pytest.raises(BackendError, match="needs CUDA"):
        MegatronBackend(
            _qwen3(), AlgoConfig(), OptimConfig(precision="bf16"), objective=RLObjective(AlgoConfig())
        )


def test_sft_refuses_the_megatron_backend_naming_the_command_that_does_it(tmp_path, capsys):
    from agentrl.cli import main

    assert main(["sft", "--env", "countdown", "--backend", "megatron", "--run-dir", str(tmp_path)]) != 0
    assert "agentrl train --backend megatron --sft-steps" in capsys.readouterr().err


def test_tp_without_megatron_and_a_world_that_cannot_hold_replicas_are_refused():
    from agentrl.errors import ConfigError
    from agentrl.trainer.config import resolve
    from agentrl.trainer.parallel_config import check_world

    with pytest.raises(ConfigError, match="need --backend megatron"):
        resolve(**{"parallel.tp": 2})
    with pytest.raises(ConfigError, match="--nproc-per-node 4"):
        check_world(resolve(**{"parallel.backend": "megatron", "parallel.tp": 2, "parallel.pp": 2}), 2)


def test_a_checkpoint_loads_back_and_another_split_is_refused_with_the_fix(one_process, tmp_path):
    """save / load in one process: the weights, the optimizer's moments and the update count come back;
    a checkpoint written under another --tp / --pp is refused before anything changes, naming both."""
    from agentrl.trainer.algorithm import RLObjective
    from agentrl.trainer.config import AlgoConfig, OptimConfig
    from agentrl.trainer.errors import CheckpointError
    from agentrl.trainer.megatron.backend import MegatronBackend

    batch = fixed_batch()
    batch.input_ids.clamp_(max=60)
    be = MegatronBackend(
        _qwen3(), AlgoConfig(), OptimConfig(micro_batch_tokens=40), objective=RLObjective(AlgoConfig())
    )
    be.train_step(batch)
    be.save(tmp_path / "ckpt", {"step": 1})
    before = be.logprobs(batch)
    fresh = MegatronBackend(
        _qwen3(), AlgoConfig(), OptimConfig(micro_batch_tokens=40), objective=RLObjective(AlgoConfig())
    )
    assert fresh.load(tmp_path / "ckpt") == {"step": 1} and fresh.updates == 1
    assert torch.equal(fresh.logprobs(batch), before)
    moments = [s["exp_avg"] for s in fresh.optimizer.state_dict()["state"].values()]
    assert moments and all(m.abs().sum() > 0 for m in moments)
    state = torch.load(tmp_path / "ckpt" / "trainer_state.pt", weights_only=False)
    state["layout"] = {"tp": 2, "pp": 1}
    torch.save(state, tmp_path / "ckpt" / "trainer_state.pt")
    with pytest.raises(CheckpointError, match="saved with --tp 2 --pp 1.*asked --tp 1 --pp 1"):
        fresh.load(tmp_path / "ckpt")


def test_a_checkpoint_resumes_only_under_the_backend_and_split_that_saved_it_refused_before_loading(tmp_path):
    """Checked with the config, before any model loads: a Megatron checkpoint's optimizer state is per
    shard (FSDP2 would fail on its missing optimizer state, another split on its shards), and an
    FSDP2 checkpoint has no shards for Megatron; each refusal names both and the fix."""
    from agentrl.errors import ConfigError
    from agentrl.trainer.config import resolve

    mg, fsdp = tmp_path / "mg" / "step-2", tmp_path / "fsdp" / "step-2"
    (mg / "megatron").mkdir(parents=True)
    fsdp.mkdir(parents=True)
    for f in (mg / "trainer_state.pt", fsdp / "trainer_state.pt", *(mg / "megatron" / f"tp{t}_pp{p}.pt"
              for t in range(2) for p in range(2))):  # fmt: skip
        f.write_bytes(b"")
    with pytest.raises(
        ConfigError, match=r"saved by --backend megatron --tp 2 --pp 2 and this run asks --backend fsdp2"
    ):
        resolve(**{"run.resume": str(mg)})
    with pytest.raises(
        ConfigError, match=r"--tp 2 --pp 2 and this run asks --backend megatron --tp 2 --pp 1.*--model"
    ):
        resolve(**{"run.resume": str(mg), "parallel.backend": "megatron", "parallel.tp": 2})
    resolve(**{"run.resume": str(mg), "parallel.backend": "megatron", "parallel.tp": 2, "parallel.pp": 2})
    with pytest.raises(ConfigError, match=r"saved by --backend fsdp2 .*resume it with --backend fsdp2"):
        resolve(**{"run.resume": str(fsdp), "parallel.backend": "megatron"})
    resolve(**{"run.resume": str(fsdp)})


class _Counting(dict):
    """A state dict that records which tensors were read."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.read: list[str] = []

    def __getitem__(self, name):
        self.read.append(name)
        return super().__getitem__(name)


@pytest.mark.parametrize(("tied", "pp_rank"), [(False, 0), (False, 1), (True, 1)])
def test_a_stage_reads_only_its_own_tensors_each_once(tied, pp_rank):
    """What lets a rank of a large model load its shard without the whole model in memory."""
    hf = _Counting(_qwen3(tied).state_dict())
    lay = layout(_qwen3(tied).config, 2, 2)
    hf_to_stage(hf, lay, tp_rank=1, pp_rank=pp_rank)
    mine = {f"model.layers.{i}." for i in range(pp_rank * 2, pp_rank * 2 + 2)}
    for name in hf.read:
        if name.startswith("model.layers."):
            assert any(name.startswith(m) for m in mine), name
    assert len(hf.read) == len(set(hf.read))
    assert ("model.embed_tokens.weight" in hf.read) == (pp_rank == 0 or tied)
    assert ("lm_head.weight" in hf.read) == (pp_rank == 1 and not tied)


def test_a_backend_from_safetensors_read_lazily_equals_one_from_the_loaded_model(one_process, tmp_path):
    """`--backend megatron` builds the policy on the meta device and reads its shard from the
    safetensors (one file, or the shards an index maps); the stage equals the fully loaded one's."""
    from safetensors.torch import save_file

    from agentrl.trainer.algorithm import RLObjective
    from agentrl.trainer.config import AlgoConfig, OptimConfig
    from agentrl.trainer.megatron.backend import MegatronBackend
    from agentrl.trainer.megatron.weights import SafetensorsWeights, lazy_policy

    hf = _qwen3()
    one, index = tmp_path / "one", tmp_path / "index"
    hf.save_pretrained(one, safe_serialization=True)
    hf.config.save_pretrained(index)
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    halves = sorted(sd)[: len(sd) // 2], sorted(sd)[len(sd) // 2 :]
    for i, names in enumerate(halves):
        save_file({n: sd[n] for n in names}, str(index / f"model-{i}.safetensors"))
    (index / "model.safetensors.index.json").write_text(
        __import__("json").dumps(
            {"weight_map": {n: f"model-{i}.safetensors" for i, h in enumerate(halves) for n in h}}
        )
    )
    batch = fixed_batch()
    batch.input_ids.clamp_(max=60)
    kw = dict(objective=RLObjective(AlgoConfig()))
    want = MegatronBackend(hf, AlgoConfig(), OptimConfig(micro_batch_tokens=40), **kw).logprobs(batch)
    for path in (one, index):
        meta, weights = lazy_policy(path)
        assert all(p.is_meta for p in meta.parameters()) and isinstance(weights, SafetensorsWeights)
        be = MegatronBackend(meta, AlgoConfig(), OptimConfig(micro_batch_tokens=40), weights=weights, **kw)
        assert torch.equal(be.logprobs(batch), want)
    assert lazy_policy(tmp_path) is None  # no safetensors here: the run loads the model whole
    with pytest.raises(BackendError, match="no model.safetensors"):
        SafetensorsWeights(tmp_path)


def test_the_kl_reference_is_cut_from_the_policys_own_slices_and_reads_back_from_its_directory(
    one_process, tmp_path
):
    """A fresh run's reference is this rank's copy of its own policy slices (no full model loaded), it
    stores as an HF directory equal to the policy, and a resumed run's reference reads back from it;
    a directory of another model is refused, naming the reference."""
    from agentrl.models import load_model
    from agentrl.trainer.algorithm import RLObjective
    from agentrl.trainer.config import AlgoConfig, OptimConfig
    from agentrl.trainer.errors import CheckpointError
    from agentrl.trainer.megatron.backend import MegatronBackend

    hf = _qwen3(tied=True)
    batch = fixed_batch()
    batch.input_ids.clamp_(max=60)
    algo = AlgoConfig(kl_coef=0.1)
    be = MegatronBackend(hf, algo, OptimConfig(micro_batch_tokens=40), objective=RLObjective(algo))
    stored = be.freeze_reference()
    assert stored is not None  # rank 0 of a world of one
    stored.save_pretrained(str(tmp_path / "reference"))  # as the run does, before any update
    back = load_model(tmp_path / "reference").float().state_dict()
    for k, v in hf.state_dict().items():
        assert torch.equal(back[k], v), k
    want = be.logprobs(batch)
    assert torch.equal(be.ref_logprobs(batch), want)
    with torch.no_grad():  # the policy moves on; the reference does not
        for p in be.model.parameters():
            p.add_(0.01)
    assert not torch.equal(be.logprobs(batch), want)
    assert torch.equal(be.ref_logprobs(batch), want)
    assert be.freeze_reference(tmp_path / "reference") is None  # a resumed run: read lazily
    assert torch.equal(be.ref_logprobs(batch), want)
    _llama().save_pretrained(tmp_path / "other", safe_serialization=True)
    with pytest.raises(CheckpointError, match="KL reference .*other.* started RL from"):
        be.freeze_reference(tmp_path / "other")
