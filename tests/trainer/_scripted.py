"""A scripted engine for rollout-classification tests: each turn answers the next text, hangs or fails."""

from __future__ import annotations

import asyncio

from agentrl.engines.errors import EngineUnavailableError
from agentrl.engines.protocol import Generation


class ScriptedEngine:
    """Answers call ``k`` with ``texts[k]`` (then ``"done"``) and the template's end of turn.

    From call ``hang_at`` on, a call generates until :meth:`release` (a model turn that is still
    running); from call ``fail_at`` on, it raises an engine error (the infrastructure failed).
    With ``replay``, the script starts again every ``replay`` calls (a retried episode meets it again).
    """

    def __init__(
        self,
        tokenizer,
        texts: list[str],
        *,
        hang_at: int | None = None,
        fail_at: int | None = None,
        replay: int | None = None,
    ) -> None:
        self.tok, self.texts = tokenizer, list(texts)
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.hang_at, self.fail_at, self.replay = hang_at, fail_at, replay
        self.weight_version, self.calls, self.released = 0, 0, False

    def release(self) -> None:
        """Let every hanging call finish (so a server that still awaits one can stop)."""
        self.released = True

    async def generate(self, input_ids, sampling, *, request_id=None) -> Generation:
        k, self.calls = self.calls, self.calls + 1
        k = k % self.replay if self.replay else k
        if self.fail_at is not None and k >= self.fail_at:
            raise EngineUnavailableError("scripted engine failure")
        while self.hang_at is not None and k >= self.hang_at and not self.released:
            await asyncio.sleep(0.02)
        text = self.texts[k] if k < len(self.texts) else "done"
        ids = [*self.tok.encode(text, add_special_tokens=False), self.end]
        return Generation(
            output_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop", weight_version=0,
            weight_versions=[0] * len(ids), request_id=request_id or "", prompt_tokens=len(input_ids),
        )  # fmt: skip
