"""Stop strings: where a sampled reply ends when the caller named strings that end it.

Engines stop on token ids only; a stop string is found in the decoded reply afterwards and
the reply is cut at the token that completed it (:func:`cut_at_stop`).
"""

from __future__ import annotations

from agentrl.engines.protocol import Generation
from agentrl.session.incremental import IncrementalTokenizer

__all__ = ["cut_at_stop"]


def cut_at_stop(
    tok: IncrementalTokenizer, gen: Generation, stop: list[str] | None
) -> tuple[list[int], list[float], list[int], str, int | None, str | None, str | None]:
    """Apply stop strings; return tokens, logprobs, versions, finish, final stop token, text,
    and the stop string that cut the reply (``text`` and it are ``None`` without a cut).

    The reply is cut after the shortest token prefix whose text holds the first stop string
    (the ledger keeps exactly those tokens); a reply without one is returned whole.
    """
    out = list(gen.output_ids)
    lps = [float(x) for x in gen.logprobs]
    vers = list(gen.weight_versions) if gen.weight_versions else [gen.weight_version] * len(out)
    finish: str = gen.finish_reason
    stop_set = set(tok.stop_token_ids)
    last_stop = out[-1] if finish == "stop" and out and out[-1] in stop_set else None
    stops = [s for s in stop or [] if s]
    if not stops:
        return out, lps, vers, finish, last_stop, None, None
    body = out[:-1] if last_stop is not None else out
    text = tok.tokenizer.decode(body, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return out, lps, vers, finish, last_stop, None, None
    idx, s = min(hits)
    need = idx + len(s)
    lo, hi = 1, len(body)  # smallest k whose decoded prefix contains the stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if (
            s
            in tok.tokenizer.decode(body[:mid], skip_special_tokens=True, clean_up_tokenization_spaces=False)[
                : need + 8
            ]
        ):
            hi = mid
        else:
            lo = mid + 1
    return body[:lo], lps[:lo], vers[:lo], "stop", None, text[:idx], s
