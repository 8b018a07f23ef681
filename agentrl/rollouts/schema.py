"""The rollout store's schema: one row per played episode, its per-token data as list columns.

A row is one episode of a train step or of an evaluation, whatever became of it
(``fate``): trained, filtered out by dynamic sampling, dropped with its group after
infrastructure retries ran out, or played by an evaluation. Per-token columns are the
episode's segments concatenated in order (``segment_starts`` marks where each begins), so
``len(token_ids) == len(loss_mask) == ...`` for every per-token column that is not null.

Per-token columns that the run did not compute are null (``train_logprobs`` and
``entropy`` on eval rows or when the update did not see the row; ``advantages`` off the
trained rows). ``SCHEMA_VERSION`` is written into every file's metadata; a reader refuses a
file of another version with a message that names it.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["EPISODE_COLUMNS", "SCHEMA", "SCHEMA_VERSION", "TOKEN_COLUMNS"]

SCHEMA_VERSION = 1
"""Bumped on any change a reader of older files would misread."""

FATES = ("trained", "filtered", "dropped", "eval")
"""``trained``: in the update. ``filtered``: its group had no advantage signal (dynamic sampling or a
zero-variance group) or was left out by a refill. ``dropped``: its group lost an episode to
infrastructure. ``eval``: played by an evaluation (never trained)."""

SCHEMA = pa.schema(
    [
        # ---- where: one key per row, unique in a run's store
        pa.field("key", pa.string(), nullable=False),  # f"{kind}/{step}/{group_id}/{episode_index}"
        pa.field("kind", pa.string(), nullable=False),  # "train" | "eval"
        pa.field(
            "step", pa.int32(), nullable=False
        ),  # metrics.jsonl's step: train rows the step they trained at (1..N), eval rows the steps done before the eval (0 = start)
        pa.field("task_id", pa.int64(), nullable=False),  # the env's reset seed
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("episode_index", pa.int32(), nullable=False),
        pa.field("env", pa.string(), nullable=False),
        # ---- outcome
        pa.field("fate", pa.string(), nullable=False),  # one of FATES
        pa.field("status", pa.string(), nullable=False),  # ok | model_error | infra_error
        pa.field("error", pa.string()),
        pa.field("cause", pa.string()),  # context_full | deadline | agent_crash for model errors
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("turn_rewards", pa.list_(pa.float64())),
        pa.field(
            "advantage", pa.float64()
        ),  # the episode's advantage (mean over its sampled tokens); null off trained rows
        pa.field("turns", pa.int32(), nullable=False),
        pa.field("attempts", pa.int32(), nullable=False),
        pa.field("truncated", pa.bool_(), nullable=False),
        pa.field("completion_tokens", pa.int32(), nullable=False),
        pa.field("finish_reasons", pa.list_(pa.string())),  # per model turn: stop | length | abort ...
        pa.field(
            "messages", pa.string()
        ),  # JSON: the conversation [{role, content, tool_calls?, tool_call_id?, name?}]; null for agent programs
        pa.field("seconds", pa.float64()),  # the episode's wall time, all attempts
        pa.field(
            "trained_version", pa.int32()
        ),  # the policy version the update started from; staleness = trained_version - versions[t]
        # ---- per token, the segments concatenated
        pa.field("segment_starts", pa.list_(pa.int32())),
        pa.field("turn_starts", pa.list_(pa.int32())),  # each sampled turn's first token
        pa.field("turn_ends", pa.list_(pa.int32())),  # one past each sampled turn's last token
        pa.field("token_ids", pa.list_(pa.int32())),
        pa.field("pieces", pa.list_(pa.string())),  # each token decoded alone
        pa.field("loss_mask", pa.list_(pa.int8())),  # 1: sampled by the engine (and trained, on trained rows)
        pa.field("logprobs", pa.list_(pa.float32())),  # behaviour (rollout) logprob; 0 off the sampled tokens
        pa.field("versions", pa.list_(pa.int32())),  # the policy version that sampled each token; -1 off them
        pa.field("advantages", pa.list_(pa.float32())),  # per-token advantage the update used
        pa.field(
            "train_logprobs", pa.list_(pa.float32())
        ),  # the trainer's logprob before its first optimizer step
        pa.field("entropy", pa.list_(pa.float32())),  # the trainer's entropy at each position (same forward)
    ],
    metadata={"agentrl.rollouts.schema": str(SCHEMA_VERSION)},
)

TOKEN_COLUMNS = (
    "token_ids", "pieces", "loss_mask", "logprobs", "versions", "advantages", "train_logprobs", "entropy",
)  # fmt: skip
"""The per-token columns; a row's non-null ones all have ``len(token_ids)`` entries."""

EPISODE_COLUMNS = tuple(f.name for f in SCHEMA if f.name not in TOKEN_COLUMNS)
"""Everything but the per-token columns: what a table of episodes reads (fast, small)."""
