"""SGLang's streamed ``/generate`` chunks read as new tokens, cumulative or incremental.

A streamed SGLang ``/generate`` answers server-sent events, each a chunk shaped like the
whole answer: ``output_ids`` and ``meta_info`` (``completion_tokens``, ``output_token_logprobs``
as ``[logprob, token_id, text]``, ``finish_reason`` null until the last chunk; ``agentrl
serve-engine`` adds ``output_token_weight_versions``). By default the ids and the per-token
lists are CUMULATIVE (every token so far); a server started with
``--incremental-streaming-output`` sends only the chunk's new tokens (SGLang's
``OutputProcessor._build_out_dict_token_id`` in
``sglang/srt/managers/tokenizer_manager_components/output_processor.py``). ``completion_tokens``
is the total so far in both modes, which tells them apart: a chunk holding at least that many
ids is cumulative (SGLang may serialize a cumulative list that has grown since its count, hence
"at least"), a shorter one incremental. Either way :class:`ChunkReader` hands out only what is new.
"""

from __future__ import annotations

from typing import Any

from agentrl.engines.errors import EngineUnavailableError
from agentrl.engines.protocol import TokenDelta

__all__ = ["ChunkReader"]


class ChunkReader:
    """The tokens of one streamed generation, chunk by chunk (see the module docstring).

    Invariants after each :meth:`read`: ``ids``, ``pairs`` (``[logprob, token_id, text]``) and,
    while every chunk labelled its tokens, ``versions`` are aligned, one entry per token so far.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self.ids: list[int] = []
        self.pairs: list[list[Any]] = []
        self.versions: list[int] | None = []
        self.meta: dict[str, Any] = {}
        self.finished = False

    def read(self, chunk: dict[str, Any]) -> TokenDelta | None:
        """The chunk's new tokens (None when it has none); raises if the chunk disagrees with itself
        or with the tokens before it."""
        if "error" in chunk:  # SGLang reports a failure after the stream started as an event
            err = chunk["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise EngineUnavailableError(f"{self.where} failed while streaming: {msg}")
        meta = chunk.get("meta_info") or {}
        pairs = list(meta.get("output_token_logprobs") or [])
        try:
            ids = [int(t) for t in chunk.get("output_ids") or [p[1] for p in pairs]]
            total = meta.get("completion_tokens")
            total = None if total is None else int(total)
        except (TypeError, ValueError, IndexError) as e:
            raise EngineUnavailableError(f"{self.where}: malformed stream chunk ({e})") from e
        versions = meta.get("output_token_weight_versions")
        seen = len(self.ids)
        if total is None or len(ids) >= total:  # cumulative: the first `seen` are known
            # an unfinished chunk's lists may have grown apart since their count: take what both hold
            n = len(ids) if meta.get("finish_reason") is not None else min(len(ids), len(pairs))
            if ids[:seen] != self.ids:
                raise EngineUnavailableError(
                    f"{self.where}: a cumulative stream chunk does not start with the {seen} tokens sent before it"
                )
            new_ids, new_pairs = ids[seen:n], pairs[seen:n]
            new_versions = None if versions is None else list(versions)[seen:n]
        else:
            if seen + len(ids) != total:
                raise EngineUnavailableError(
                    f"{self.where}: an incremental stream chunk of {len(ids)} tokens after {seen} does not "
                    f"make completion_tokens={total}"
                )
            new_ids, new_pairs = ids, pairs
            new_versions = None if versions is None else list(versions)
        try:
            logprobs = self._check(new_ids, new_pairs, new_versions)
        except (TypeError, ValueError, IndexError) as e:
            raise EngineUnavailableError(f"{self.where}: malformed stream chunk ({e})") from e
        self.ids += new_ids
        self.pairs += new_pairs
        if self.versions is not None and new_versions is not None:
            self.versions += [int(v) for v in new_versions]
        else:
            self.versions = None  # an unlabelled chunk: the client labels every token itself
        self.meta = meta
        self.finished = meta.get("finish_reason") is not None
        if not new_ids:
            return None
        return TokenDelta(new_ids, logprobs, [int(v) for v in new_versions or []])

    def _check(self, ids: list[int], pairs: list[list[Any]], versions: list[Any] | None) -> list[float]:
        """The new tokens' logprobs, once ids, logprobs and versions agree."""
        if len(pairs) != len(ids):
            raise EngineUnavailableError(
                f"{self.where}: a stream chunk carried {len(ids)} new ids but {len(pairs)} logprobs"
            )
        if any(int(p[1]) != t for p, t in zip(pairs, ids, strict=True)):
            raise EngineUnavailableError(
                f"{self.where}: a stream chunk's logprobs name other token ids than its output_ids"
            )
        if versions is not None and len(versions) != len(ids):
            raise EngineUnavailableError(
                f"{self.where}: a stream chunk carried {len(ids)} new ids but {len(versions)} weight versions"
            )
        return [float(p[0]) for p in pairs]

    def answer(self) -> dict[str, Any]:
        """The whole generation as one non-streamed ``/generate`` answer (the last chunk's
        ``meta_info`` with every token's lists); raises if the stream ended unfinished or short."""
        if not self.finished:
            raise EngineUnavailableError(
                f"{self.where}: the stream ended after {len(self.ids)} tokens without a finish_reason"
            )
        total = self.meta.get("completion_tokens")
        if total is not None and int(total) != len(self.ids):
            raise EngineUnavailableError(
                f"{self.where}: the stream carried {len(self.ids)} tokens but the server counted {total}"
            )
        meta = {**self.meta, "output_token_logprobs": self.pairs}
        meta.pop("output_token_weight_versions", None)
        if self.versions is not None:
            meta["output_token_weight_versions"] = self.versions
        return {"output_ids": self.ids, "meta_info": meta}
