"""A deterministic Engine for tests: replies with scripted texts, tokenized by the model's tokenizer."""

from __future__ import annotations

from collections import deque
from typing import Any

from agentrl.engines.protocol import Generation
from agentrl.types import SamplingParams


class ScriptedEngine:
    """Implements the Engine protocol; each ``generate`` pops the next scripted reply.

    A reply is ``(text, stop)``: ``text`` is tokenized, then the stop token id ``stop``
    is appended (``None``: the reply ends by length). Every prompt is recorded in ``prompts``.
    """

    def __init__(self, tokenizer: Any, stop_token: str | None = None) -> None:
        self.tok = tokenizer
        self.stop_id = tokenizer.convert_tokens_to_ids(stop_token or tokenizer.eos_token)
        self.replies: deque[tuple[str, int | None]] = deque()
        self.prompts: list[list[int]] = []
        self.outputs: list[list[int]] = []
        self.version = 0
        self.fail_next: Exception | None = None

    def push(self, text: str, stop: int | str | None | bool = True) -> None:
        if stop is True:
            sid: int | None = self.stop_id
        elif isinstance(stop, str):
            sid = self.tok.convert_tokens_to_ids(stop)
        elif stop is False or stop is None:
            sid = None
        else:
            sid = stop
        self.replies.append((text, sid))

    @property
    def weight_version(self) -> int:
        return self.version

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> Generation:
        if self.fail_next is not None:
            e, self.fail_next = self.fail_next, None
            raise e
        self.prompts.append(list(input_ids))
        text, sid = self.replies.popleft() if self.replies else ("ok", self.stop_id)
        ids = list(self.tok.encode(text, add_special_tokens=False))[: sampling.max_new_tokens]
        finish = "length"
        if sid is not None and len(ids) < sampling.max_new_tokens:
            ids.append(sid)
            finish = "stop"
        self.outputs.append(ids)
        return Generation(
            output_ids=ids,
            logprobs=[-0.25 - 0.001 * i for i in range(len(ids))],
            finish_reason=finish,  # type: ignore[arg-type]
            weight_version=self.version,
            weight_versions=[self.version] * len(ids),
            request_id=request_id or "",
            prompt_tokens=len(input_ids),
        )

    async def update_weights(self, *args: Any, **kwargs: Any) -> int:
        self.version += 1
        return self.version

    async def abort(self, request_id: str) -> bool:
        return False

    async def health(self) -> dict[str, Any]:
        return {"ok": True}
