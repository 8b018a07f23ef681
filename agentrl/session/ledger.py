"""The token ledger: the exact tokens of a session, segment by segment.

For every segment the ledger holds the token ids sent to the engine and sampled by
it, in order, with per-token metadata. Invariants (checked by :meth:`Segment.check`
and by the fidelity suite):

- ``loss_mask[t] == 1`` exactly on tokens the engine sampled; prompt, template,
  tool and environment tokens have 0;
- ``logprobs[t]`` / ``versions[t]`` are the rollout logprob and weight version of a
  sampled token, and 0.0 / -1 elsewhere;
- turn ``k``'s prompt is the whole segment before ``turns[k].start``: it extends
  turn ``k-1``'s prompt plus its sampled tokens — tokens are only ever appended.

A history that is not an extension of the segment's messages starts a new segment
(a separate training sample); tokens of a closed segment never change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl.session.errors import LedgerError
from agentrl.types import Message, ToolSpec, Trajectory, TurnSpan

__all__ = ["Ledger", "Segment", "Turn"]


@dataclass
class Turn:
    """One assistant turn: ``[prompt_start, start)`` was appended as prompt, ``[start, end)`` sampled."""

    prompt_start: int
    start: int
    end: int
    finish_reason: str
    parse_failed: bool = False


@dataclass
class Segment:
    """A contiguous token sequence: one training sample."""

    index: int
    tools: list[ToolSpec] | None
    template_kwargs: dict[str, Any]
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    """The conversation these tokens represent, as the agent sees it (replies as parsed)."""
    returned: dict[int, list[Message]] = field(default_factory=dict)
    """Other forms of assistant message ``i`` the client was given (the raw text of a reply whose
    calls it asked not to parse, a streamed text the final parse did not extend): a client that
    sends one back sent back what it was given."""
    last_stop: int | None = None
    """The stop token that ended the last turn, if the model sampled one."""

    def append_prompt(self, ids: list[int]) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.versions.extend([-1] * len(ids))

    def append_sampled(self, ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        if not (len(ids) == len(logprobs) == len(versions)):
            raise LedgerError(
                f"sampled tokens ({len(ids)}), logprobs ({len(logprobs)}) and versions ({len(versions)}) differ"
            )
        self.token_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)
        self.versions.extend(int(v) for v in versions)

    @property
    def num_sampled(self) -> int:
        return sum(t.end - t.start for t in self.turns)

    def check(self) -> None:
        """Raise LedgerError if an invariant does not hold (cheap; O(len))."""
        n = len(self.token_ids)
        if not (len(self.loss_mask) == len(self.logprobs) == len(self.versions) == n):
            raise LedgerError("ledger per-token lists are not aligned")
        mask = [0] * n
        pos = 0
        for t in self.turns:
            if not (t.prompt_start == pos and t.prompt_start <= t.start <= t.end <= n):
                raise LedgerError(f"turn spans are not contiguous at {t}")
            mask[t.start : t.end] = [1] * (t.end - t.start)
            pos = t.end
        if mask != self.loss_mask:
            raise LedgerError("loss mask does not cover exactly the sampled turn spans")

    def to_trajectory(self, episode_id: str) -> Trajectory:
        last = self.turns[-1] if self.turns else None
        return Trajectory(
            token_ids=list(self.token_ids),
            loss_mask=list(self.loss_mask),
            rollout_logprobs=list(self.logprobs),
            policy_versions=list(self.versions),
            episode_id=episode_id,
            segment=self.index,
            turn_spans=[TurnSpan(start=t.start, end=t.end) for t in self.turns],
            num_turns=len(self.turns),
            truncated=last is not None and last.finish_reason == "length",
            metrics={
                "tito/parse_failures": float(sum(t.parse_failed for t in self.turns)),
                "tito/prompt_tokens": float(len(self.token_ids) - self.num_sampled),
                "tito/sampled_tokens": float(self.num_sampled),
            },
        )


@dataclass
class Ledger:
    """All segments of one session; the last one is open."""

    session_id: str
    segments: list[Segment] = field(default_factory=list)
    divergences: dict[str, int] = field(default_factory=dict)

    @property
    def current(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    def new_segment(self, tools: list[ToolSpec] | None, template_kwargs: dict[str, Any]) -> Segment:
        seg = Segment(index=len(self.segments), tools=tools, template_kwargs=dict(template_kwargs))
        self.segments.append(seg)
        return seg

    def trajectories(self) -> list[Trajectory]:
        """One Trajectory per segment that has at least one sampled turn, in order."""
        return [s.to_trajectory(self.session_id) for s in self.segments if s.turns]
