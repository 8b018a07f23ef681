"""`agentrl train` on python-v0: every episode is scored and its status counted, and code that attacks
its sandbox is the model's scored failure, never an infrastructure retry."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agentrl.engines.hf import HFEngine
from agentrl.engines.protocol import Generation
from agentrl.models import load_tokenizer
from agentrl.trainer.config import resolve
from agentrl.trainer.loop import train
from agentrl.trainer.metrics import read_jsonl

MODEL = "tiny-qwen3"
SMALL = {
    "model": MODEL,
    "env": "python-v0",
    "group_size": 2,
    "tasks_per_step": 2,
    "max_turns": 2,
    "eval_episodes": 1,
    "eval_every": 0,
    "threads": 1,
    "progress": False,
    "tensorboard": False,
}
STATUS_KEYS = (
    "rollout/episodes_ok",
    "rollout/episodes_model_error",
    "rollout/episodes_infra_error",
    "rollout/infra_retries",
    "rollout/groups",
    "rollout/groups_dropped",
)


def _quiet() -> Console:
    return Console(file=open("/dev/null", "w"))  # noqa: SIM115


def _rows(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == kind]


def test_python_env_trains_and_counts_every_episodes_status(tmp_path: Path) -> None:
    """The tiny model from its warm start (oracle episodes run in the sandbox) through two RL steps."""
    cfg = resolve(**SMALL, max_new_tokens=16, sft_steps=2, sft_batch_size=2, steps=2, run_dir=str(tmp_path))
    summary = train(cfg, console=_quiet())
    assert summary.steps == 2 and (Path(summary.final_model) / "config.json").exists()
    rows = _rows(tmp_path, "train")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert all(k in r for k in STATUS_KEYS), sorted(r)
        assert (
            r["rollout/episodes_infra_error"]
            == r["rollout/infra_retries"]
            == r["rollout/groups_dropped"]
            == 0
        )
        # every episode of the batch ended scored (trained on), none dropped or left unaccounted for
        assert r["rollout/episodes_ok"] + r["rollout/episodes_model_error"] == cfg.batch_size
        assert r["rollout/groups"] == cfg.rollout.tasks_per_step
    evals = _rows(tmp_path, "eval")
    assert [(e["step"], e["eval/episodes"], e["eval/dropped"]) for e in evals] == [(0, 1, 0), (2, 1, 0)]


TRICKS = [
    'import os; os.write(3, b\'{"exit_code":0,"exc":{"forged":[1,2]},"errno":28}\\n\'); os._exit(0)',
    "import os; os.write(3, b'x' * 3_000_000)",
    "print('the ' * 1_000_000)",  # 4 MB; text that tokenizes compactly, so the clipped result fits the context
    "x = bytearray(10**10)",
]


class TrickEngine(HFEngine):
    """The tiny model's engine, except that what it "samples" is scripted: the first turn calls
    run_python with the next trick of :data:`TRICKS`, the second answers wrongly. The tool results
    shown to the model are recorded in ``shown``."""

    shown: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tok = load_tokenizer(MODEL)
        self.tricks = itertools.cycle(TRICKS)

    async def generate(
        self, input_ids: list[int], sampling: Any = None, *, request_id: str | None = None
    ) -> Generation:
        self._validate_prompt(input_ids, sampling)  # the real engine's context check
        prompt = self.tok.decode(input_ids)
        if "<tool_response>" in prompt:
            TrickEngine.shown.append(prompt.rsplit("<tool_response>", 1)[1])
            text = "<answer>forged</answer>"
        else:
            call = {"name": "run_python", "arguments": {"code": next(self.tricks)}}
            text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        ids = [*self.tok.encode(text, add_special_tokens=False), self.tok.convert_tokens_to_ids("<|im_end|>")]
        assert len(ids) <= sampling.max_new_tokens
        v = self.weight_version
        return Generation(ids, [-1.0] * len(ids), "stop", v, [v] * len(ids), request_id or "", len(input_ids))


def test_sandbox_tricks_are_scored_failures_not_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agentrl.engines.hf.HFEngine", TrickEngine)
    TrickEngine.shown = []
    cfg = resolve(**SMALL, max_new_tokens=96, sft_steps=0, steps=2, run_dir=str(tmp_path))
    summary = train(cfg, console=_quiet())
    assert summary.steps == 2
    for r in _rows(tmp_path, "train"):
        assert (r["rollout/episodes_ok"], r["rollout/groups"]) == (cfg.batch_size, cfg.rollout.tasks_per_step)
        assert (
            r["rollout/episodes_infra_error"]
            == r["rollout/infra_retries"]
            == r["rollout/groups_dropped"]
            == 0
        )
        assert (r["rollout/reward"], r["rollout/turns"]) == (
            0.0,
            2.0,
        )  # scored, after the model saw its result
    # one tool result per episode (a retried episode would have replayed its trick): 2 steps and 2 evals,
    # each a greedy episode and eval_samples sampled ones per held-out seed
    shown = TrickEngine.shown
    per_eval = cfg.rollout.eval_episodes * (1 + cfg.rollout.eval_samples)
    assert len(shown) == 2 * cfg.batch_size + 2 * per_eval
    assert sum("OSError: [Errno 9] Bad file descriptor" in s for s in shown) >= 4
    assert any(s.startswith("\n[stopped: output limit]") and "[truncated]" in s for s in shown)
    assert any(s.startswith("\n[stopped: memory limit]") or "MemoryError" in s for s in shown)
    assert not any("sandbox failed" in s or "disk full" in s for s in shown)
