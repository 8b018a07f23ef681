"""Evaluation a reader can trust: pass@k (unbiased), bootstrap intervals, dropped episodes as failures."""

from __future__ import annotations

import io
import json
from fractions import Fraction
from math import comb
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agentrl.errors import ConfigError
from agentrl.trainer.config import resolve
from agentrl.trainer.errors import EvalInputError
from agentrl.trainer.evaluation import Outcome, TaskResult, bootstrap_ci, eval_metrics, pass_at_k
from agentrl.trainer.metrics import summary_table
from agentrl.trainer.runtime import build_runtime, evaluate

SOLVED = f"{Path(__file__).with_name('_eval_env.py')}:AlwaysSolved"
TINY: dict[str, Any] = {"model": "tiny-qwen3", "env": SOLVED, "max_new_tokens": 2, "eval_seed_offset": 0,
        "max_infra_retries": 0, "progress": False, "tensorboard": False}  # fmt: skip


# ---------------------------------------------------------------- the estimator


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 1, 0.4),  # pass@1 is the share of correct samples
        (5, 0, 3, 0.0),
        (5, 5, 1, 1.0),
        (5, 3, 3, 1.0),  # n - c < k: every draw of 3 holds a correct one
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_on_exact_small_cases(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_binomial_formula_everywhere_and_stays_finite_for_large_n():
    for n in range(1, 11):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - Fraction(comb(n - c, k), comb(n, k))
                assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12), (n, c, k)
    exact = 1 - Fraction(comb(1000 - 3, 500), comb(1000, 500))  # binomials of ~300 digits
    assert pass_at_k(1000, 3, 500) == pytest.approx(float(exact), rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 5), (4, 1, 0), (4, 5, 1), (0, 0, 1)])
def test_pass_at_k_refuses_what_it_cannot_estimate(n, c, k):
    with pytest.raises(EvalInputError, match=rf"pass_at_k\(n={n}, c={c}, k={k}\).*1 <= k <= n"):
        pass_at_k(n, c, k)


# ---------------------------------------------------------------- the interval


def test_bootstrap_interval_of_a_fixed_case_matches_the_binomial_quantiles():
    """20 tasks, half solved: a resampled mean is Binomial(20, 0.5) / 20, whose 2.5 % and 97.5 %
    quantiles are 6/20 and 14/20; the interval is reproducible and the same for the same seed."""
    values = [1.0] * 10 + [0.0] * 10
    lo, hi = bootstrap_ci(values)
    assert lo == pytest.approx(0.30, abs=0.026) and hi == pytest.approx(0.70, abs=0.026)
    assert bootstrap_ci(values) == (lo, hi)
    assert bootstrap_ci(values, seed=1) != (lo, hi)  # the seed is what fixes it
    wide = bootstrap_ci([1.0] * 3 + [0.0] * 3)
    assert wide[1] - wide[0] > hi - lo  # fewer tasks, a wider interval
    assert bootstrap_ci([0.25] * 7) == (0.25, 0.25)  # every task scores the same


def test_bootstrap_refuses_no_tasks():
    with pytest.raises(EvalInputError, match="needs at least one value"):
        bootstrap_ci([])


# ---------------------------------------------------------------- the metrics


def _ok(reward: float = 1.0) -> Outcome:
    return Outcome(reward, False, 3, 1)


DROPPED = Outcome(0.0, True)


def test_dropped_samples_are_failed_samples_in_pass_at_k():
    """Task 2 played one of its 2 samples (solved) and lost the other to the infrastructure:
    c = 1 of n = 2, so its pass@1 is 0.5 and pass@2 is 1; the means are over both tasks."""
    tasks = [
        TaskResult(0, _ok(), (_ok(), _ok())),
        TaskResult(1, _ok(0.5), (_ok(), DROPPED)),
    ]
    ev = eval_metrics(tasks, threshold=1.0, ks=[1, 2])
    assert ev["eval/pass@1"] == 0.75 and ev["eval/pass@2"] == 1.0
    assert ev["eval/solved"] == 0.5  # the greedy return 0.5 is under the threshold
    assert ev["eval/dropped"] == 1 and ev["eval/sampled_episodes"] == 3
    assert ev["eval/sampled_reward"] == 1.0  # over the samples that played
    assert ev["eval/pass@1_lo"] <= 0.75 <= ev["eval/pass@1_hi"]


# ---------------------------------------------------------------- k <= n


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"eval_samples": 2, "eval_k": "1,4"}, "k=4 exceeds rollout.eval_samples=2"),
        ({"eval_samples": 0, "eval_k": "1"}, "k=1 exceeds rollout.eval_samples=0"),
        ({"eval_k": "0"}, "k=0 must be 1 or more"),
        ({"eval_k": "1;4"}, "expected comma-separated integers"),
    ],
)
def test_pass_at_k_beyond_the_samples_is_refused_with_the_fix(kwargs, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        resolve(**kwargs)
    assert "eval_k" in str(e.value)


def test_the_default_ks_are_one_and_n():
    from agentrl.trainer.evaluation import parse_ks

    assert parse_ks("", 4) == [1, 4] and parse_ks("", 1) == [1] and parse_ks("", 0) == []
    assert parse_ks("4, 1,2", 4) == [1, 2, 4]


def test_eval_command_refuses_k_over_n_before_loading_a_model(capsys):
    from agentrl.cli import main

    rc = main(["eval", "--eval-samples", "2", "--eval-k", "1,3"])
    err = capsys.readouterr().err
    assert rc == 1 and "k=3 exceeds rollout.eval_samples=2" in err and "--eval-samples to 3" in err
    assert "Traceback" not in err


# ---------------------------------------------------------------- on a model


def test_a_dropped_eval_episode_counts_as_a_failure():
    """Seed 1's env fails for infrastructure on every attempt: of 4 held-out seeds, 3 are solved,
    so greedy solved and pass@1 read 0.75 (not 1.0 over the ones that played), and eval/dropped
    counts seed 1's greedy episode and its 2 samples."""
    rt = build_runtime(resolve(**TINY, eval_episodes=4, eval_samples=2))
    try:
        ev = evaluate(rt)
    finally:
        rt.close()
    assert ev["eval/solved"] == 0.75 and ev["eval/pass@1"] == 0.75 and ev["eval/pass@2"] == 0.75
    assert ev["eval/dropped"] == 3 and ev["eval/episodes"] == 3 and ev["eval/sampled_episodes"] == 6
    assert ev["eval/reward"] == 1.0  # the reward average is over the episodes that played


def test_eval_command_prints_pass_at_k_with_intervals_and_json(capsys):
    from agentrl.cli import main

    argv = ["eval", "--env", SOLVED, "--model", "tiny-qwen3", "--max-new-tokens", "2", "--eval-seed-offset", "0",
            "--max-infra-retries", "0", "--eval-episodes", "4", "--eval-samples", "3", "--eval-k", "1,3"]  # fmt: skip
    rc = main(argv)
    out = capsys.readouterr().out
    assert rc == 0
    assert "4 held-out seeds from 0, one greedy episode each and 3 sampled at temperature 1.0" in out
    assert "success: return >= 1" in out and "95 % interval" in out and "eval/pass@3" in out
    ev = json.loads(out.strip().splitlines()[-1])
    assert ev["eval/samples"] == 3 and ev["eval/sampled_episodes"] == 9 and ev["eval/dropped"] == 4
    assert ev["eval/pass@1"] == ev["eval/pass@3"] == ev["eval/solved"] == 0.75
    assert ev["eval/pass@1_lo"] <= 0.75 <= ev["eval/pass@1_hi"]


def test_the_run_summary_shows_solved_and_pass_at_k_start_to_end(tmp_path):
    start = eval_metrics([TaskResult(0, _ok(0.0), (_ok(0.0), _ok())), TaskResult(1, DROPPED, (_ok(), _ok()))],
                         threshold=1.0, ks=[1, 2])  # fmt: skip
    end = eval_metrics([TaskResult(0, _ok(), (_ok(), _ok())), TaskResult(1, _ok(), (_ok(), _ok()))],
                       threshold=1.0, ks=[1, 2])  # fmt: skip
    rows = [{"kind": "eval", "step": 0, **start}, {"kind": "eval", "step": 3, **end}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    buf = io.StringIO()
    Console(file=buf, width=200).print(summary_table(tmp_path / "metrics.jsonl"))
    text = buf.getvalue()
    line = {
        ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in text.splitlines() if ln.count("│") == 3
    }
    assert line["eval pass@1 [95 % interval], start of RL"].startswith("0.750 [")  # (0.5 + 1) / 2
    assert line["eval solved [95 % interval], start of RL"].startswith("0.000 [")  # the dropped one failed
    assert line["eval pass@2 [95 % interval], end of RL"] == "1.000 [1.000, 1.000]"
    assert "eval episodes dropped (counted as failures)" in text
