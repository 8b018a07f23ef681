"""Turning played episodes into the store's rows (:mod:`agentrl.rollouts.schema`).

An episode is duck-typed (:class:`agentrl.trainer.rollout.Episode`'s fields): this layer sits
below the trainer and imports nothing of it. ``records`` maps ``(episode_id, segment)`` to what
the update did with that trajectory (an object with ``advantages``, ``positions``, ``logprobs`` and
``entropy``: :class:`agentrl.trainer.algorithm.TokenRecord`).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from agentrl.errors import ConfigError

__all__ = ["PieceDecoder", "SaveRule", "episode_row", "parse_save_rule"]


class PieceDecoder:
    """Each token id decoded alone, cached per id (a vocabulary's pieces are few; episodes repeat them)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, ids: Iterable[int]) -> list[str]:
        out = []
        for i in ids:
            piece = self.cache.get(i)
            if piece is None:
                piece = self.cache[i] = self.tokenizer.decode([i])
            out.append(piece)
        return out


class SaveRule:
    """``--save-rollouts``: ``all``, ``none``, or ``sample:N`` — at most N episodes a step, whole
    groups, chosen by a seeded draw so a resumed run keeps the same ones."""

    def __init__(self, mode: str, limit: int | None = None) -> None:
        self.mode, self.limit = mode, limit

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    def choose(self, groups: Sequence[Sequence[Any]], *, step: int, kind: str) -> list[Sequence[Any]]:
        if self.mode == "all" or self.limit is None:
            return list(groups)
        order = list(range(len(groups)))
        random.Random(f"{kind}/{step}").shuffle(order)
        out: list[int] = []
        n = 0
        for i in order:
            if n + len(groups[i]) > self.limit and out:
                break
            out.append(i)
            n += len(groups[i])
        return [groups[i] for i in sorted(out)]


def parse_save_rule(text: str) -> SaveRule:
    """``all`` | ``none`` | ``sample:N`` (N ≥ 1); anything else a ConfigError naming the value."""
    if text in ("all", "none"):
        return SaveRule(text)
    head, _, n = text.partition(":")
    if head == "sample" and n.isdigit() and int(n) >= 1:
        return SaveRule("sample", int(n))
    raise ConfigError(
        f"run.save_rollouts={text!r}: must be 'all', 'none' or 'sample:N' (N >= 1 episodes a step, whole groups)"
    )


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def episode_row(
    ep: Any,
    *,
    kind: str,
    step: int,
    env: str,
    fate: str,
    decode: Callable[[Iterable[int]], list[str]],
    records: Mapping[tuple[str, int], Any] | None = None,
    trained_version: int | None = None,
    key: str | None = None,
    index: int | None = None,
) -> dict[str, Any]:
    """One episode's row; its trajectories' segments concatenated in order."""
    trajs = list(ep.trajectories)
    idx = index if index is not None else _index(ep)
    tok: dict[str, list[Any]] = {k: [] for k in ("token_ids", "loss_mask", "logprobs", "versions")}
    seg_starts, t_starts, t_ends = [], [], []
    adv: list[float] = []
    tlp: list[float] = []
    ent: list[float] = []
    recorded = records is not None and any((t.episode_id, t.segment) in records for t in trajs)
    for t in trajs:
        off = len(tok["token_ids"])
        seg_starts.append(off)
        tok["token_ids"] += t.token_ids
        tok["loss_mask"] += t.loss_mask
        tok["logprobs"] += [_finite(x) for x in t.rollout_logprobs]
        tok["versions"] += t.policy_versions
        for span in t.turn_spans:
            t_starts.append(off + span.start)
            t_ends.append(off + span.end)
        if recorded:
            assert records is not None
            rec = records.get((t.episode_id, t.segment))
            n = len(t.token_ids)
            a, lp, en = [0.0] * n, [0.0] * n, [0.0] * n
            if rec is not None:
                a[: len(rec.advantages)] = [_finite(x) for x in rec.advantages[:n]]
                for p, x, e in zip(rec.positions, rec.logprobs, rec.entropy, strict=True):
                    if p < n:
                        lp[p], en[p] = _finite(x), _finite(e)
            adv += a
            tlp += lp
            ent += en
    sampled = [a for a, m in zip(adv, tok["loss_mask"], strict=True) if m] if recorded else []
    group_id = ep.group_id
    return {
        "key": key or f"{kind}/{step}/{group_id}/{idx}",
        "kind": kind,
        "step": step,
        "task_id": int(ep.seed),
        "group_id": group_id,
        "episode_index": idx,
        "env": env,
        "fate": fate,
        "status": ep.status,
        "error": ep.error,
        "cause": ep.cause,
        "reward": float(ep.reward),
        "turn_rewards": list(ep.turn_rewards),
        "advantage": sum(sampled) / len(sampled) if sampled else None,
        "turns": int(ep.turns),
        "attempts": int(ep.attempts),
        "truncated": bool(ep.truncated),
        "completion_tokens": int(ep.completion_tokens),
        "finish_reasons": list(ep.finish_reasons),
        "messages": json.dumps(ep.messages, ensure_ascii=False) if ep.messages is not None else None,
        "seconds": float(ep.seconds),
        "trained_version": trained_version,
        "segment_starts": seg_starts,
        "turn_starts": t_starts,
        "turn_ends": t_ends,
        **tok,
        "pieces": decode(tok["token_ids"]),
        "advantages": adv if recorded else None,
        "train_logprobs": tlp if recorded else None,
        "entropy": ent if recorded else None,
    }


def _index(ep: Any) -> int:
    """The episode's index in its group, from its trajectories' ``episode_id`` (``group/index``); 0 when it has none."""
    for t in ep.trajectories:
        tail = t.episode_id.rpartition("/")[2]
        if tail.isdigit():
            return int(tail)
    return 0
