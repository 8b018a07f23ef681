"""The in-process session API: one token ledger per agent episode, driving an Engine.

``SessionManager`` is what the trainer's rollout loop and the HTTP server both use::

    sm = SessionManager(tokenizer, engine)            # family detected from the template
    sid = await sm.create()
    reply = await sm.chat(sid, messages, tools, SamplingParams(max_new_tokens=64))
    ...                                               # run tools, append results, call chat again
    trajectories = await sm.close(sid)                # one Trajectory per segment

It implements :class:`~agentrl.session.backend.SessionBackend` (every call awaited), as the
HTTP client of a session server does.

Each ``chat`` call compares the messages with the session's history
(:mod:`agentrl.session.history`). If they extend it, only the appended messages are
tokenized (see :mod:`agentrl.session.incremental`) and appended to the ledger as prompt
tokens; otherwise the history *diverged* (edited, truncated, reordered, tools changed, an
assistant turn the engine did not produce): a new segment starts from a full
render, and ``tito/divergences`` counts it. The engine's reply is appended as
sampled tokens, exactly as sampled (up to a stop string, :mod:`agentrl.session.stops`),
and parsed into the returned message.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from agentrl.engines.errors import ContextLengthError, EngineRequestError
from agentrl.engines.protocol import Engine, Generation, TokenDelta, stream_generate
from agentrl.session.audit import AuditReport, audit_segment
from agentrl.session.backend import ChatResult, TurnCalls, TurnRequest
from agentrl.session.errors import (
    ContextFullError,
    SessionEngineError,
    SessionRequestError,
    UnknownSessionError,
)
from agentrl.session.families import Family, detect_family, get_family
from agentrl.session.history import plan_turn, same_message, turn_prompt
from agentrl.session.incremental import IncrementalTokenizer
from agentrl.session.ledger import Ledger, Turn
from agentrl.session.stops import cut_at_stop
from agentrl.types import Message, SamplingParams, ToolSpec, Trajectory

__all__ = ["ChatResult", "SessionManager", "same_message"]


@dataclass
class _Session:
    ledger: Ledger
    api_key: str = field(default_factory=lambda: f"sk-agentrl-{secrets.token_urlsafe(24)}")
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    created: float = field(default_factory=time.time)
    turns: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    """Per-dialect state kept with the session (e.g. stored Responses for ``previous_response_id``)."""


class SessionManager(TurnCalls):
    """Token-ledger sessions over one tokenizer, one chat-template family and one engine.

    ``family`` is a family name or :class:`Family` (detected from the tokenizer when
    ``None``). ``engine_timeout_s`` bounds every engine call. Safe to use from many
    asyncio tasks at once; turns of one session are serialized.
    """

    def __init__(
        self,
        tokenizer: Any,
        engine: Engine,
        family: str | Family | None = None,
        *,
        model_name: str | None = None,
        engine_timeout_s: float = 600.0,
        max_sessions: int = 100_000,
    ) -> None:
        if isinstance(family, str):
            family = get_family(family)
        self.family: Family = family or detect_family(tokenizer, model_name)
        self.tok = IncrementalTokenizer(tokenizer, self.family)
        self.engine = engine
        self.model_name = model_name or getattr(tokenizer, "name_or_path", "") or "agentrl"
        self.engine_timeout_s = engine_timeout_s
        self.max_sessions = max_sessions
        self._sessions: dict[str, _Session] = {}
        self._by_key: dict[str, str] = {}
        self.counters: Counter[str] = Counter()
        self.timers: dict[str, float] = defaultdict(float)

    # ---------------------------------------------------------------- the SessionBackend surface
    @property
    def family_name(self) -> str:
        return self.family.name

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self.tok.stop_token_ids)

    async def aclose(self) -> None:
        """Nothing to release: the engine belongs to whoever made it."""

    # ---------------------------------------------------------------- lifecycle
    async def create(self, session_id: str | None = None) -> str:
        """Open a session and return its id (a fresh one unless given)."""
        sid = session_id or uuid.uuid4().hex
        if sid in self._sessions:
            raise SessionRequestError(f"session {sid!r} already exists; pick another id or omit it")
        if len(self._sessions) >= self.max_sessions:
            raise SessionRequestError(
                f"{len(self._sessions)} sessions are open (max_sessions={self.max_sessions}); close finished ones"
            )
        sess = self._sessions[sid] = _Session(ledger=Ledger(session_id=sid))
        self._by_key[sess.api_key] = sid
        self.counters["tito/sessions_created"] += 1
        return sid

    def session_key(self, session_id: str) -> str:
        """The session's API key: the gateway's proof that a request comes from its agent."""
        return self._get(session_id).api_key

    def session_for_key(self, api_key: str) -> str | None:
        """The id of the open session whose key is ``api_key`` (``None`` if no session has it)."""
        return self._by_key.get(api_key)

    def session_state(self, session_id: str) -> dict[str, Any]:
        """Mutable per-session storage for the dialects (dropped with the session)."""
        return self._get(session_id).state

    def _get(self, session_id: str) -> _Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise UnknownSessionError(
                f"no session {session_id!r}; create one with POST /sessions (or SessionManager.create())"
            ) from None

    async def close(self, session_id: str) -> list[Trajectory]:
        """Close the session and return its trajectories."""
        sess = self._get(session_id)
        trajs = sess.ledger.trajectories()
        del self._sessions[session_id]
        self._by_key.pop(sess.api_key, None)
        return trajs

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    @property
    def num_sessions(self) -> int:
        return len(self._sessions)

    def ledger(self, session_id: str) -> Ledger:
        """The session's ledger (read it, do not modify it)."""
        return self._get(session_id).ledger

    async def trajectories(self, session_id: str) -> list[Trajectory]:
        """One Trajectory per segment with at least one sampled turn."""
        return self._get(session_id).ledger.trajectories()

    def info(self, session_id: str) -> dict[str, Any]:
        """A summary of the session for ``GET /sessions/{id}``."""
        s = self._get(session_id)
        segs = s.ledger.segments
        return {
            "id": session_id,
            "model": self.model_name,
            "family": self.family.name,
            "created": s.created,
            "num_turns": s.turns,
            "num_segments": len([g for g in segs if g.turns]),
            "num_tokens": sum(len(g.token_ids) for g in segs),
            "num_sampled_tokens": sum(g.num_sampled for g in segs),
            "divergences": dict(s.ledger.divergences),
            "messages": [m.model_dump(exclude_none=True) for m in segs[-1].messages] if segs else [],
        }

    # ---------------------------------------------------------------- tokenize
    # SessionBackend's signature; only the call's shape is shared with AsyncSessionClient.tokenize.
    async def tokenize(
        self,
        messages: list[Message],
        tools: list[ToolSpec] | None = None,
        *,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of a full render, exactly as a segment's first turn would send them."""
        return self.tok.prompt_ids(
            messages, tools, template_kwargs, add_generation_prompt=add_generation_prompt
        )

    # ---------------------------------------------------------------- turns
    def _sampling(self, sampling: SamplingParams | None) -> SamplingParams:
        sp = sampling or SamplingParams.model_validate({})
        stops = sorted(set(sp.stop_token_ids) | set(self.tok.stop_token_ids))
        return sp.model_copy(update={"stop_token_ids": stops})

    async def chat(
        self,
        session_id: str,
        messages: list[Message],
        tools: list[ToolSpec] | None = None,
        sampling: SamplingParams | None = None,
        **kwargs: Any,
    ) -> Message:
        """Run one assistant turn and return the parsed reply (see :meth:`chat_completion`)."""
        return (await self.chat_completion(session_id, messages, tools, sampling, **kwargs)).message

    async def _turn(self, session_id: str, turn: TurnRequest) -> ChatResult:
        """Run one assistant turn (``chat_completion``; the messages are the whole conversation so far).

        ``stop`` strings end the reply at their first occurrence; the ledger keeps
        the sampled tokens up to the one that completed the stop string. Raises
        SessionRequestError for bad input, TemplateError when the template cannot be
        tokenized incrementally, SessionEngineError when the engine fails (nothing
        is committed then; the turn can be retried).
        """
        sess, kwargs, tools, sampling = self._check_turn(session_id, turn)
        messages = turn.messages
        async with sess.lock:
            appended, reason, input_ids, prompt_add = self._begin(sess, messages, tools, kwargs)
            gen = await self._generate(session_id, input_ids, sampling)
            # commit: nothing above touched the ledger
            res = self._commit(
                session_id,
                sess,
                appended is None,
                reason,
                tools,
                kwargs,
                messages,
                prompt_add,
                gen,
                turn.stop,
            )
            res.prompt_tokens = len(input_ids)
            return res

    # chat_completion's arguments (TurnCalls), here as a stream: deltas, then the ChatResult
    async def chat_stream(
        self,
        session_id: str,
        messages: list[Message],
        tools: list[ToolSpec] | None = None,
        sampling: SamplingParams | None = None,
        *,
        stop: list[str] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> AsyncGenerator[TokenDelta | ChatResult, None]:
        """:meth:`chat_completion`, streamed: the engine's :class:`TokenDelta` items as it samples
        them, then the committed :class:`ChatResult`.

        The turn is committed only once the engine finished; closing the iterator before the
        ``ChatResult`` (a client that disconnected) aborts the generation and records nothing.
        Errors are raised as by :meth:`chat_completion`, before the first delta when the engine
        rejects the prompt.
        """
        turn = TurnRequest(messages, tools, sampling, stop, template_kwargs)
        sess, kwargs, tools, sampling = self._check_turn(session_id, turn)
        async with sess.lock:
            appended, reason, input_ids, prompt_add = self._begin(sess, messages, tools, kwargs)
            gen: Generation | None = None
            t0 = time.perf_counter()
            stream = stream_generate(
                self.engine,
                input_ids,
                sampling,
                request_id=f"{session_id}-{uuid.uuid4().hex[:8]}",
            )
            # one deadline for the turn, checked at every wait for the engine, so it fires in here
            # (the engine request is cancelled) and never in the stream reader's code
            deadline = asyncio.get_running_loop().time() + self.engine_timeout_s
            try:
                while gen is None:
                    left = deadline - asyncio.get_running_loop().time()
                    item = await asyncio.wait_for(anext(stream), max(left, 0.0))
                    if isinstance(item, TokenDelta):
                        yield item
                    else:
                        gen = item
            except StopAsyncIteration:
                pass
            except Exception as e:
                raise self._engine_failure(session_id, input_ids, e) from e
            finally:
                await stream.aclose()
                self.timers["tito/engine_seconds"] += time.perf_counter() - t0
            if gen is None:
                self.counters["tito/engine_errors"] += 1
                raise SessionEngineError(
                    f"the engine's stream for session {session_id!r} ended without a result; nothing was recorded"
                )
            self._check_generation(gen)
            res = self._commit(
                session_id, sess, appended is None, reason, tools, kwargs, messages, prompt_add, gen, stop
            )
            res.prompt_tokens = len(input_ids)
            yield res

    def turn_sampling(self, session_id: str, sampling: SamplingParams | None) -> SamplingParams | None:
        """The sampling one turn of ``session_id`` runs with, streamed or not: the request's here.

        Called once per turn by :meth:`chat_completion` and :meth:`chat_stream`, so a subclass
        that pins a session's sampling (a trainer driving a black-box agent) overrides this one
        method and covers every dialect, streamed or not.
        """
        del session_id
        return sampling

    def _check_turn(
        self, session_id: str, turn: TurnRequest
    ) -> tuple[_Session, dict[str, Any], list[ToolSpec] | None, SamplingParams]:
        """The turn's session, template kwargs, tools and sampling (with the template's stop ids)."""
        sess = self._get(session_id)
        if not turn.messages:
            raise SessionRequestError("messages is empty; send at least one message")
        kwargs = {**self.family.template_kwargs, **(turn.template_kwargs or {})}
        sampling = self._sampling(self.turn_sampling(session_id, turn.sampling))
        return sess, kwargs, turn.tools or None, sampling

    def _begin(
        self, sess: _Session, messages: list[Message], tools: list[ToolSpec] | None, kwargs: dict[str, Any]
    ) -> tuple[list[Message] | None, str | None, list[int], list[int]]:
        """Plan the turn (extend or diverge) and tokenize its prompt; touches nothing."""
        seg = sess.ledger.current
        t0 = time.perf_counter()
        appended, reason = plan_turn(seg, messages, tools, kwargs)
        base, prompt_add = turn_prompt(
            self.tok, seg if appended is not None else None, appended, tools, kwargs, messages
        )
        self.timers["tito/tokenize_seconds"] += time.perf_counter() - t0
        return appended, reason, base + prompt_add, prompt_add

    def _commit(
        self,
        session_id: str,
        sess: _Session,
        new_segment: bool,
        reason: str | None,
        tools: list[ToolSpec] | None,
        kwargs: dict[str, Any],
        messages: list[Message],
        prompt_add: list[int],
        gen: Generation,
        stop: list[str] | None,
    ) -> ChatResult:
        """Append the turn (prompt tokens, then the sampled ones) to the ledger; the parsed reply."""
        led = sess.ledger
        out, lps, vers, finish, last_stop, text, stop_string = cut_at_stop(self.tok, gen, stop)
        if stop_string is not None:
            self.counters["tito/stop_string_cuts"] += 1
        if new_segment or led.current is None:
            if reason is not None:
                led.divergences[reason] = led.divergences.get(reason, 0) + 1
                self.counters["tito/divergences"] += 1
                self.counters[f"tito/divergences/{reason}"] += 1
            seg = led.new_segment(tools, kwargs)
        else:
            seg = led.current
        turn_idx = sess.turns
        parsed = self.tok.parse(
            out[:-1] if last_stop is not None else out,
            lambda i: f"call_{session_id[:8]}_{turn_idx}_{i}",
            text=text,
        )
        start_prompt = len(seg.token_ids)
        seg.append_prompt(prompt_add)
        start = len(seg.token_ids)
        seg.append_sampled(out, lps, vers)
        seg.turns.append(
            Turn(
                prompt_start=start_prompt,
                start=start,
                end=len(seg.token_ids),
                finish_reason=finish,
                parse_failed=parsed.parse_failed,
            )
        )
        seg.last_stop = last_stop
        seg.messages = [*messages, parsed.message]
        if parsed.message.tool_calls:  # what a client that asked for no tool calls is given
            seg.returned[len(messages)] = [Message(role="assistant", content=parsed.text)]
        sess.turns += 1
        self._count_turn(len(prompt_add), len(out), parsed.parse_failed, len(parsed.message.tool_calls or []))
        return ChatResult(
            message=parsed.message,
            finish_reason=finish,
            prompt_tokens=0,
            completion_tokens=len(out),
            output_ids=out,
            logprobs=lps,
            segment=seg.index,
            diverged=reason,
            parse_failed=parsed.parse_failed,
            stop_string=stop_string,
            raw_text=parsed.text,
        )

    def note_returned(self, session_id: str, res: ChatResult, returned: Message) -> None:
        """Record that the client was given ``returned`` for the turn ``res`` (a streamed text the
        final parse did not extend), so that sending it back extends the segment."""
        seg = self._get(session_id).ledger.segments[res.segment]
        for i in range(len(seg.messages) - 1, -1, -1):
            if seg.messages[i] is res.message:
                seg.returned.setdefault(i, []).append(returned)
                return

    def _count_turn(self, prompt_added: int, sampled: int, parse_failed: bool, tool_calls: int) -> None:
        self.counters["tito/turns"] += 1
        self.counters["tito/prompt_tokens_appended"] += prompt_added
        self.counters["tito/sampled_tokens"] += sampled
        if parse_failed:
            self.counters["tito/parse_failures"] += 1
        if tool_calls:
            self.counters["tito/tool_calls"] += tool_calls

    async def _generate(self, session_id: str, input_ids: list[int], sampling: SamplingParams) -> Generation:
        t0 = time.perf_counter()
        try:
            gen = await asyncio.wait_for(
                self.engine.generate(input_ids, sampling, request_id=f"{session_id}-{uuid.uuid4().hex[:8]}"),
                timeout=self.engine_timeout_s,
            )
        except Exception as e:
            raise self._engine_failure(session_id, input_ids, e) from e
        finally:
            self.timers["tito/engine_seconds"] += time.perf_counter() - t0
        self._check_generation(gen)
        return gen

    def _engine_failure(self, session_id: str, input_ids: list[int], e: Exception) -> Exception:
        """The session error for an engine call that raised ``e`` (counted); nothing was recorded."""
        if isinstance(e, TimeoutError):
            self.counters["tito/engine_errors"] += 1
            return SessionEngineError(
                f"the engine did not answer within {self.engine_timeout_s:g}s for session {session_id!r} "
                f"({len(input_ids)} prompt tokens); nothing was recorded, retry the turn"
            )
        if isinstance(e, ContextLengthError):
            self.counters["tito/context_full"] += 1
            return ContextFullError(f"session {session_id!r}: {e}; nothing was recorded")
        if isinstance(e, EngineRequestError):  # the prompt itself is unacceptable: the caller's to fix
            self.counters["tito/engine_rejections"] += 1
            return SessionRequestError(
                f"the engine rejected the turn for session {session_id!r}: {e}; nothing was recorded"
            )
        self.counters["tito/engine_errors"] += 1
        return SessionEngineError(
            f"the engine failed for session {session_id!r}: {type(e).__name__}: {e}; "
            "nothing was recorded, retry the turn"
        )

    def _check_generation(self, gen: Generation) -> None:
        n = len(gen.output_ids)
        if len(gen.logprobs) != n or (gen.weight_versions and len(gen.weight_versions) != n):
            self.counters["tito/engine_errors"] += 1
            raise SessionEngineError(
                f"the engine returned {n} tokens but {len(gen.logprobs)} logprobs and "
                f"{len(gen.weight_versions)} weight versions; nothing was recorded"
            )

    # ---------------------------------------------------------------- audit
    def audit(self, session_id: str) -> list[AuditReport]:
        """Audit every segment of the session against a canonical render (counted in metrics)."""
        reports = [audit_segment(self.tok, s) for s in self._get(session_id).ledger.segments if s.turns]
        for r in reports:
            self.record_audit(r)
        return reports

    def record_audit(self, report: AuditReport) -> None:
        self.counters["tito/audits"] += 1
        self.counters["tito/audit/turns"] += report.turns
        for k, v in report.counts.items():
            self.counters[f"tito/audit/{k}"] += v
        self.counters["tito/audit/unexplained"] += report.unexplained

    # ---------------------------------------------------------------- metrics
    def metrics(self) -> dict[str, float]:
        """Counters and timers (``tito/*``), plus open sessions."""
        out: dict[str, float] = {k: float(v) for k, v in self.counters.items()}
        out.update({k: float(v) for k, v in self.timers.items()})
        out["tito/sessions_open"] = float(len(self._sessions))
        for key in (
            "tito/divergences",
            "tito/parse_failures",
            "tito/turns",
            "tito/engine_errors",
            "tito/audit/unexplained",
        ):
            out.setdefault(key, 0.0)
        return out
