"""The conformance checker: ``check_engine`` verifies an engine keeps the :class:`~agentrl.engines.Engine` contract.

Checks, in order (each failure raises :class:`EngineCheckError` naming the engine, the
check, what was seen and the fix). Every phase runs through
:func:`~agentrl.engines.protocol.run_sync` on a fresh event loop, as the trainer calls it:

``type``         the object satisfies ``Engine`` (names) and reports ``EngineCapabilities``
``health``       ``health()`` answers ``status == "ok"``
``generation``   ids inside the vocabulary, ``max_new_tokens`` respected (``"length"`` at the cap),
                 one finite logprob ``<= 0`` and one non-decreasing weight version per token, the
                 request id echoed, ``max_new_tokens=1`` gives one token
``seed``         the same seed gives the same tokens
``stop``         a stop id ends the request with ``"stop"`` and is included in the output
``bad-input``    an out-of-vocabulary id, an empty prompt and an over-long request raise the
                 ``EngineRequestError`` classes, and the engine keeps serving
``logprobs``     with ``reference`` (a model with the engine's weights): logprobs equal a
                 teacher-forced forward under the same filters (plain, top-k, top-p, greedy)
                 within ``logprob_atol``
``sampling``     with ``reference``: the frequencies of seeded draws follow the reference's
                 distribution (first token) and its conditional one (second token given the
                 first), chi-square tests at ``sampling_alpha`` (see
                 :mod:`agentrl.engines.sampling_check`); the statistics land in the report
``versions``     per supported path (state dict, checkpoint): an update bumps the version by one,
                 an explicit version is taken, a rejected update raises ``WeightUpdateError``
                 and keeps the version, and later tokens carry the new version; an unknown
                 distributed group is rejected; an unsupported path raises
                 ``UnsupportedWeightUpdateError``
``abort``        ``abort(request_id)`` ends a running request with ``"abort"`` and a partial output;
                 aborting an unknown id does not raise
``deadline``     a caller's deadline (``run_sync(timeout_s=...)``) raises ``EngineTimeoutError`` and
                 the engine keeps serving
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from agentrl.engines.errors import (
    ContextLengthError,
    EngineCheckError,
    EngineRequestError,
    EngineTimeoutError,
    InvalidTokenError,
    UnsupportedWeightUpdateError,
    WeightUpdateError,
)
from agentrl.engines.protocol import Engine, EngineCapabilities, Generation, run_sync
from agentrl.engines.sampling_check import DEFAULT_SETTINGS, ChiSquare, sampling_tests
from agentrl.errors import ConfigError
from agentrl.types import SamplingParams

__all__ = ["EngineCheckReport", "check_engine", "check_sampling"]

T = TypeVar("T")
_WHAT = {"first": "first-token frequencies", "second|first": "second-token frequencies given the first"}
_PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
_SAMPLING_SEED = 1_000_000
_SAMPLING_BATCH = 128
"""Requests in flight at once, and in each ``timeout_s`` deadline, during the sampling check."""


@dataclass
class EngineCheckReport:
    """Which checks passed and which were skipped (with the reason), and the sampling tests' statistics."""

    engine: str
    passed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    sampling: dict[str, ChiSquare] = field(default_factory=dict)
    """``"sampling[T=0.7] first"`` / ``"... second|first"`` -> its chi-square test (statistic, dof, p-value)."""


def _sp(**kw: Any) -> SamplingParams:
    return SamplingParams.model_validate(kw)


class _Checker:
    def __init__(
        self, engine: Engine, name: str, vocab_size: int, max_context: int, timeout_s: float
    ) -> None:
        self.engine, self.name, self.vocab, self.max_context = engine, name, vocab_size, max_context
        self.timeout_s = timeout_s
        self.report = EngineCheckReport(engine=name)

    def fail(self, check: str, problem: str) -> EngineCheckError:
        return EngineCheckError(f"check_engine({self.name}): {check}: {problem}")

    def run(self, check: str, what: str, make: Callable[[], Awaitable[T]]) -> T:
        async def call() -> T:
            return await make()

        return run_sync(call(), timeout_s=self.timeout_s, what=f"check_engine({self.name}) {check}: {what}")

    def gen(
        self, check: str, prompt: list[int], params: SamplingParams, rid: str | None = None
    ) -> Generation:
        return self.run(check, "generate", lambda: self.engine.generate(prompt, params, request_id=rid))

    def expect_error(
        self, check: str, what: str, cls: type[Exception], make: Callable[[], Awaitable[Any]]
    ) -> None:
        try:
            self.run(check, what, make)
        except cls:
            return
        except Exception as e:  # noqa: BLE001 - reported as the contract failure it is
            raise self.fail(check, f"{what} raised {type(e).__name__}: {e}; expected {cls.__name__}") from e
        raise self.fail(check, f"{what} returned normally; expected it to raise {cls.__name__}")

    # ------------------------------------------------------------------ checks

    def type_(self) -> None:
        if not isinstance(self.engine, Engine):
            missing = [m for m in ("generate", "abort", "health", "weight_version", "capabilities",
                                   "update_weights_from_state_dict", "update_weights_from_path",
                                   "init_weights_update_group", "update_weights_from_distributed",
                                   "destroy_weights_update_group", "close") if not hasattr(self.engine, m)]  # fmt: skip
            raise self.fail(
                "type", f"{type(self.engine).__name__} lacks {missing}; implement the Engine protocol"
            )
        if not isinstance(self.engine.capabilities, EngineCapabilities):
            raise self.fail("type", "capabilities must be an EngineCapabilities")
        health = self.run("health", "health()", self.engine.health)
        if health.get("status") != "ok":
            raise self.fail("health", f"health() = {health!r}; expected status 'ok' on a fresh engine")
        self.report.passed += ["type", "health"]

    def generation(self) -> None:
        check = "generation"
        g = self.gen(check, _PROMPT, _sp(max_new_tokens=8, temperature=1.0, seed=11), rid="check-engine-gen")
        self.well_formed(check, g, 8)
        if g.request_id != "check-engine-gen":
            raise self.fail(check, f"request_id {g.request_id!r} is not the one given ('check-engine-gen')")
        one = self.gen(check, _PROMPT, _sp(max_new_tokens=1, seed=1))
        if len(one.output_ids) != 1:
            raise self.fail(check, f"max_new_tokens=1 gave {len(one.output_ids)} tokens")
        again = self.gen("seed", _PROMPT, _sp(max_new_tokens=8, temperature=1.0, seed=11))
        if again.output_ids != g.output_ids:
            raise self.fail(
                "seed", f"seed 11 gave {g.output_ids} then {again.output_ids}; seed the request's sampler"
            )
        stop_id = g.output_ids[min(2, len(g.output_ids) - 1)]
        s = self.gen(
            "stop", _PROMPT, _sp(max_new_tokens=8, temperature=1.0, seed=11, stop_token_ids=[stop_id])
        )
        want = g.output_ids[: g.output_ids.index(stop_id) + 1]
        if s.output_ids != want or s.finish_reason != "stop":
            raise self.fail("stop", f"stop_token_ids=[{stop_id}] gave {s.output_ids} ({s.finish_reason!r}); "
                                    f"expected {want} ('stop'): stop at the first stop id and include it")  # fmt: skip
        self.report.passed += [check, "seed", "stop"]

    def well_formed(self, check: str, g: Generation, max_new: int) -> None:
        n = len(g.output_ids)
        if not 1 <= n <= max_new:
            raise self.fail(check, f"{n} output ids for max_new_tokens={max_new}")
        bad = [t for t in g.output_ids if not isinstance(t, int) or not 0 <= t < self.vocab]
        if bad:
            raise self.fail(check, f"output ids {bad} are outside [0, {self.vocab})")
        if len(g.logprobs) != n or not all(math.isfinite(x) and x <= 1e-6 for x in g.logprobs):
            raise self.fail(
                check, f"logprobs {g.logprobs} for {n} tokens; need one finite logprob <= 0 per token"
            )
        if g.finish_reason not in ("stop", "length", "abort"):
            raise self.fail(check, f"finish_reason {g.finish_reason!r}; use 'stop', 'length' or 'abort'")
        if g.finish_reason == "length" and n != max_new:
            raise self.fail(check, f"finish_reason 'length' after {n} of {max_new} tokens")
        v = g.weight_versions
        if (
            len(v) != n
            or any(a > b for a, b in zip(v, v[1:], strict=False))
            or (v and v[-1] > g.weight_version)
        ):
            raise self.fail(check, f"weight_versions {v} (weight_version {g.weight_version}) for {n} tokens; need "
                                   "one non-decreasing version per token, none above weight_version")  # fmt: skip

    def bad_input(self) -> None:
        check = "bad-input"
        cases: list[tuple[str, list[int], SamplingParams, type[Exception]]] = [
            ("an out-of-vocabulary id", [1, self.vocab], _sp(max_new_tokens=2), InvalidTokenError),
            ("an empty prompt", [], _sp(max_new_tokens=2), InvalidTokenError),
            ("prompt + max_new_tokens over the context", [1, 2],
             _sp(max_new_tokens=self.max_context), ContextLengthError),
        ]  # fmt: skip
        for what, prompt, params, cls in cases:
            self.expect_error(
                check, f"generate with {what}", cls, functools.partial(self.engine.generate, prompt, params)
            )
            if not issubclass(cls, EngineRequestError):
                raise self.fail(check, f"{cls.__name__} must be an EngineRequestError")
        self.well_formed(check, self.gen(check, _PROMPT, _sp(max_new_tokens=2, seed=3)), 2)
        self.report.passed.append(check)

    def logprobs(self, reference: torch.nn.Module, atol: float) -> None:
        from agentrl.engines.sampling import SamplingBatch, filtered_logprobs

        check = "logprobs"
        for kw in ({"temperature": 1.0}, {"temperature": 0.7, "top_k": 20}, {"temperature": 1.0, "top_p": 0.8},
                   {"temperature": 0.0}):  # fmt: skip
            params = _sp(max_new_tokens=12, seed=5, **kw)
            g = self.gen(check, _PROMPT, params)
            ids = torch.tensor([_PROMPT + g.output_ids])
            with torch.no_grad():
                logits = reference(ids).logits[0, len(_PROMPT) - 1 : -1].float()
            n = len(g.output_ids)
            batch = SamplingBatch.build([params.temperature] * n, [params.top_p] * n, [params.top_k] * n)
            ref = filtered_logprobs(logits, batch).gather(-1, torch.tensor(g.output_ids)[:, None]).squeeze(-1)
            diff = float((torch.tensor(g.logprobs) - ref).abs().max())
            if not diff <= atol:  # a NaN (a reported -inf against -inf) fails too
                raise self.fail(check, f"sampling {kw}: logprobs differ from a teacher-forced forward by {diff:.2e} "
                                       f"(> {atol}); report the log-probability under the distribution sampled from")  # fmt: skip
        self.report.passed.append(check)

    def sampling(
        self, reference: torch.nn.Module, settings: Sequence[Mapping[str, Any]], draws: int, alpha: float
    ) -> None:
        for kw in settings:
            params = _sp(**kw)
            check = (
                "sampling[" + ",".join(f"{'T' if k == 'temperature' else k}={v}" for k, v in kw.items()) + "]"
            )
            if params.temperature <= 0:
                raise self.fail(check, "greedy sampling has no frequencies to test; give a temperature > 0")

            def run(make: Callable[[], Awaitable[list[Generation]]], c: str = check) -> list[Generation]:
                return self.run(c, "a batch of seeded 2-token draws", make)

            tests, problem = sampling_tests(
                self.engine, reference, _PROMPT, params, vocab_size=self.vocab, draws=draws,
                seed=_SAMPLING_SEED, concurrency=_SAMPLING_BATCH, max_groups=8, run=run,
            )  # fmt: skip
            if problem is not None:
                raise self.fail(check, problem)
            for test, result in tests.items():
                if result is None:
                    self.report.skipped[f"{check} {test}"] = f"{draws} draws too few for two categories"
                    continue
                self.report.sampling[f"{check} {test}"] = result
                if result.p_value < alpha:
                    raise self.fail(f"{check} {test}", f"{result} < {alpha}: the {_WHAT[test]} of seeded draws "
                                    "do not follow the reference's distribution; the sampler draws from another "
                                    "distribution than it reports (temperature, top-k/top-p, or random numbers "
                                    "reused across steps)")  # fmt: skip
            self.report.passed.append(check)

    def versions(self, reference: torch.nn.Module | None, checkpoint: Path | None) -> None:
        caps, eng = self.engine.capabilities, self.engine
        updates: dict[str, tuple[Callable[[int | None], Awaitable[int]], Callable[[], Awaitable[int]]]] = {}
        if caps.state_dict and reference is not None:
            sd = reference.state_dict()
            updates["state_dict"] = (
                lambda v: eng.update_weights_from_state_dict(sd, version=v),
                lambda: eng.update_weights_from_state_dict({"no.such.tensor": torch.zeros(2)}),
            )
        elif not caps.state_dict:
            self.expect_error("versions", "update_weights_from_state_dict on an engine without that path",
                              UnsupportedWeightUpdateError,
                              lambda: eng.update_weights_from_state_dict({"x": torch.zeros(1)}))  # fmt: skip
        if caps.checkpoint and checkpoint is not None:
            missing = Path(tempfile.gettempdir()) / f"check-engine-missing-{os.getpid()}"
            updates["checkpoint"] = (
                lambda v: eng.update_weights_from_path(checkpoint, version=v),
                lambda: eng.update_weights_from_path(missing),
            )
        if not updates:
            self.report.skipped["versions"] = (
                "no supported update path was given weights (reference / checkpoint)"
            )
            return
        for path, (update, reject) in updates.items():
            check = f"versions[{path}]"
            v0 = eng.weight_version
            got = self.run(check, "update", lambda u=update: u(None))  # type: ignore[misc]
            if got != v0 + 1 or eng.weight_version != v0 + 1:
                raise self.fail(check, f"an update from version {v0} returned {got} (weight_version "
                                       f"{eng.weight_version}); expected {v0 + 1} from both")  # fmt: skip
            g = self.gen(check, _PROMPT, _sp(max_new_tokens=3, seed=2))
            if set(g.weight_versions) != {v0 + 1} or g.weight_version != v0 + 1:
                raise self.fail(
                    check, f"tokens after the update carry versions {g.weight_versions}; expected {v0 + 1}"
                )
            want = v0 + 10
            got = self.run(check, f"update with version={want}", lambda u=update, w=want: u(w))  # type: ignore[misc]
            if got != want or eng.weight_version != want:
                raise self.fail(
                    check, f"update(version={want}) gave {got} / weight_version {eng.weight_version}"
                )
            self.expect_error(check, "a rejected update", WeightUpdateError, reject)
            if eng.weight_version != want:
                raise self.fail(check, f"a rejected update moved the version {want} -> {eng.weight_version}")
            self.report.passed.append(check)
        if caps.distributed:
            check, v = "versions[distributed]", eng.weight_version
            self.expect_error(check, "update_weights_from_distributed on an unknown group", WeightUpdateError,
                              lambda: eng.update_weights_from_distributed(["x"], ["float32"], [[1]],
                                                                          group_name="check-engine-no-group"))  # fmt: skip
            if eng.weight_version != v:
                raise self.fail(check, f"a rejected bucket moved the version {v} -> {eng.weight_version}")
            self.report.passed.append(check)

    def abort(self) -> None:
        check = "abort"
        # ignore_eos: a small model can sample its end-of-sequence token before the first abort lands,
        # so only the abort (or thousands of tokens) can end this request
        long = _sp(max_new_tokens=self.max_context - len(_PROMPT), temperature=1.0, seed=4, ignore_eos=True)

        async def run() -> Generation:
            task = asyncio.create_task(self.engine.generate(_PROMPT, long, request_id="check-engine-abort"))
            # an abort that arrives before the request (an HTTP engine) finds no such id and is a
            # no-op, so keep asking until the request has ended
            while not task.done():
                await asyncio.sleep(0.02)
                await self.engine.abort("check-engine-abort")
            return await task

        g = self.run(check, "abort a running request", run)
        if g.finish_reason != "abort" or len(g.output_ids) >= long.max_new_tokens:
            raise self.fail(check, f"an aborted request ended {g.finish_reason!r} after {len(g.output_ids)} tokens; "
                                   "expected 'abort' with the partial output")  # fmt: skip
        self.run(check, "abort an unknown request", lambda: self.engine.abort("check-engine-no-such-request"))
        self.report.passed.append(check)

    def deadline(self) -> None:
        check = "deadline"
        long = _sp(max_new_tokens=self.max_context - len(_PROMPT), temperature=1.0, seed=6)
        try:
            run_sync(self.engine.generate(_PROMPT, long), timeout_s=0.05, what="check_engine deadline probe")
        except EngineTimeoutError:
            pass
        else:
            raise self.fail(check, "a generate under a 0.05 s deadline finished; expected EngineTimeoutError")
        self.well_formed(check, self.gen(check, _PROMPT, _sp(max_new_tokens=2, seed=3)), 2)
        self.report.passed.append(check)


def check_engine(
    engine: Engine,
    *,
    vocab_size: int,
    max_context: int,
    reference: torch.nn.Module | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    logprob_atol: float = 1e-4,
    sampling_draws: int = 2000,
    sampling_alpha: float = 1e-3,
    sampling_settings: Sequence[Mapping[str, Any]] = DEFAULT_SETTINGS,
    timeout_s: float = 120.0,
    name: str | None = None,
) -> EngineCheckReport:
    """Run every check on ``engine`` (see the module docstring); raise ``EngineCheckError`` on the first failure.

    ``reference`` is a model holding the weights the engine serves now (fp32, on CPU): it is
    the teacher-forced forward for ``logprobs`` and the state dict of ``versions[state_dict]``.
    ``checkpoint`` is a safetensors directory of the same weights the engine can read. Both
    updates write the same weights, so the later checks still see them. Call it from sync code
    (no running event loop); every call has the deadline ``timeout_s``.

    ``sampling`` draws ``sampling_draws`` seeded two-token completions per setting of
    ``sampling_settings`` (``SamplingParams`` fields; temperature > 0) and fails a chi-square
    test whose p-value is below ``sampling_alpha``; ``sampling_draws=0`` skips it.
    """
    _check_sampling_args(sampling_draws, sampling_alpha)
    c = _Checker(engine, name or type(engine).__name__, vocab_size, max_context, timeout_s)
    c.type_()
    c.generation()
    c.bad_input()
    if reference is not None:
        c.logprobs(reference, logprob_atol)
    else:
        c.report.skipped["logprobs"] = "no reference model given"
    if reference is not None and sampling_draws > 0:
        c.sampling(reference, sampling_settings, sampling_draws, sampling_alpha)
    else:
        c.report.skipped["sampling"] = "no reference model given" if reference is None else "sampling_draws=0"
    c.versions(reference, Path(checkpoint) if checkpoint is not None else None)
    c.abort()
    c.deadline()
    return c.report


def check_sampling(
    engine: Engine,
    reference: torch.nn.Module,
    *,
    vocab_size: int,
    draws: int = 2000,
    alpha: float = 1e-3,
    settings: Sequence[Mapping[str, Any]] = DEFAULT_SETTINGS,
    timeout_s: float = 120.0,
    name: str | None = None,
) -> EngineCheckReport:
    """``check_engine``'s ``sampling`` check alone (see :mod:`agentrl.engines.sampling_check`).

    For an engine known to keep the rest of the contract, e.g. to compare the samplers of
    two engines on one model: the report's ``sampling`` holds every test's statistic, degrees
    of freedom and p-value. Raises ``EngineCheckError`` on a p-value below ``alpha``.
    """
    _check_sampling_args(draws, alpha)
    c = _Checker(engine, name or type(engine).__name__, vocab_size, 1 << 30, timeout_s)
    c.sampling(reference, settings, draws, alpha)
    return c.report


def _check_sampling_args(draws: int, alpha: float) -> None:
    if draws < 0 or not 0 < alpha < 1:
        raise ConfigError(
            f"sampling draws={draws}, alpha={alpha}; need draws >= 0 (0 skips the check) and 0 < alpha < 1"
        )
