"""LLM judges: reward functions that have a model behind an OpenAI-compatible Chat Completions API grade completions.

A judge is a reward function with TRL's ``GRPOTrainer`` signature,
``await judge(completions, prompts, **columns) -> list[float]`` (one score in [0, 1] per
completion; prompts and completions are strings or chat message lists; each dataset column
arrives as a keyword holding one value per completion). Two modes:

- :class:`JudgeReward` (``pointwise``): one request per completion. The judge sees the rubric,
  the prompt, the row's reference answer (its ``answer`` column, else ``reference``; the
  ``column`` option names another) and the completion, and ends its reply with ``SCORE: N`` (an integer
  0-10, scaled to [0, 1]; ``N/M`` is read as the fraction). The last such line counts.
- :class:`GroupJudgeReward` (``group``): the completions of one prompt are graded together in one
  request, relative to each other (``SCORE 1: N`` ... ``SCORE G: N``); a batch is split into
  groups by prompt and reference. :meth:`GroupJudgeReward.score_group` grades one group.

Failures are never scored 0 (CONTRIBUTING.md, "Who failed"):

- **infrastructure** (:class:`~agentrl.envs.errors.EnvInfraError`, retried by the rollout): the
  judge could not be reached, passed its deadline, answered 429 or 5xx, or gave no parseable
  score, each after ``retries`` more attempts with backoff;
- **configuration** (:class:`~agentrl.envs.errors.RewardFunctionError`, a
  :class:`~agentrl.errors.ConfigError`: the run stops): any other 4xx (an unknown model, a bad
  key, a request the server refuses), naming the URL, the status, the server's message and the
  fix. Bad options and a missing reference column are the same class.

Every request has a deadline (``timeout_s``) and goes through agentrl's one HTTP client
(:class:`~agentrl.httpkit.HTTPClient`). At most ``max_concurrency`` requests of one judge are in
flight at a time, across every event loop and thread of the process. Grades are kept in an LRU
cache keyed by (model, rubric, prompt, completion, reference), so a repeated completion is not
graded again; :meth:`JudgeReward.metrics` counts requests, cache hits and re-asked answers.
:func:`judge_from_options` builds a judge from the flat options a CLI or an env passes.
"""

from __future__ import annotations

import asyncio
import difflib
import math
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentrl.envs.datasets.judge_state import LRUCache, Slots, gather_all
from agentrl.envs.datasets.judge_text import (
    DEFAULT_RUBRIC,
    GROUP_FORMAT,
    POINTWISE_FORMAT,
    content_text,
    parse_group_scores,
    parse_score,
    render,
    sections,
    shown,
)
from agentrl.envs.errors import EnvInfraError, RewardFunctionError
from agentrl.httpkit import ErrorAnswer, Failure, HTTPClient
from agentrl.httpkit.client import Answer, backoff

__all__ = ["DEFAULT_RUBRIC", "GroupJudgeReward", "JudgeReward", "judge_from_options", "parse_score"]


_RETRY_STATUS = (429, 500, 502, 503, 504)
REFERENCE_COLUMNS = ("answer", "reference")
"""The columns read as the reference answer, first found wins, unless ``column`` names one."""


class JudgeReward:
    """A reward function graded by an LLM judge, one request per completion (see the module docstring).

    Args:
        base_url: the API's base URL, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is appended).
        model: the judge's model name as its server lists it (``GET {base_url}/models``).
        rubric: what a good response is; the score format is appended to it.
        api_key: the key itself, or ``api_key_env``: the environment variable holding it (local
            servers need none).
        max_concurrency: the most requests of this judge in flight at once, process-wide (>= 1).
        timeout_s: the deadline of one request (> 0).
        retries: more attempts after a failed one (no answer, 429/5xx, no parseable score; >= 0).
        backoff_s: the delay before the first retry, doubling each time.
        cache_size: graded (prompt, completion, reference) kept; 0 keeps none.
        temperature, max_tokens: the judge's sampling (>= 0, >= 1).
        column: the column holding the reference answer (default: ``answer``, else ``reference``), as
            the built-in rewards' ``column`` option.
    """

    mode: ClassVar[str] = "pointwise"
    name = "judge"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        rubric: str = DEFAULT_RUBRIC,
        api_key: str | None = None,
        api_key_env: str | None = None,
        max_concurrency: int = 8,
        timeout_s: float = 60.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        cache_size: int = 4096,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        column: str | None = None,
    ) -> None:
        for option, value, ok in (
            ("max_concurrency", max_concurrency, max_concurrency >= 1),
            ("timeout_s", timeout_s, timeout_s > 0),
            ("retries", retries, retries >= 0),
            ("cache_size", cache_size, cache_size >= 0),
            ("temperature", temperature, temperature >= 0),
            ("max_tokens", max_tokens, max_tokens >= 1),
        ):
            if not ok:
                raise RewardFunctionError(
                    f"{type(self).__name__}: {option}={value!r} is out of range (see its docstring)"
                )
        base_url = base_url.rstrip("/").removesuffix("/chat/completions")
        self.base_url, self.model, self.rubric = base_url, model, rubric
        self.max_concurrency, self.timeout_s, self.retries = max_concurrency, timeout_s, retries
        self.backoff_s, self.temperature, self.max_tokens = backoff_s, temperature, max_tokens
        self.column = column
        self.__name__ = self.name  # TRL logs a reward function by its __name__
        if api_key is None and api_key_env is not None:
            api_key = _env_key(api_key_env)
        self._http = HTTPClient(
            base_url,
            on_failure=self._no_answer,
            timeout_s=timeout_s,
            retries=retries,
            backoff_s=backoff_s,
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
            max_connections=max_concurrency,
        )
        self._slots = Slots(max_concurrency)
        self._cache = LRUCache(cache_size)
        self._counts = {"requests": 0, "cache_hits": 0, "reasked": 0}
        self._count_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r}, model={self.model!r})"

    # ------------------------------------------------------------------ the reward function
    async def __call__(
        self, completions: Sequence[Any], prompts: Sequence[Any], **columns: Any
    ) -> list[float]:
        """One score in [0, 1] per completion; raises EnvInfraError / RewardFunctionError, never scores a failure.

        Rows alike in prompt, completion and reference are graded once (counted as cache hits).
        """
        refs = self._references(completions, prompts, columns)
        rows = [
            (render(p), render(c), None if r is None else render(r))
            for p, c, r in zip(prompts, completions, refs, strict=True)
        ]
        unique = list(dict.fromkeys(rows))
        for _ in range(len(rows) - len(unique)):
            self._count("cache_hits")
        graded = dict(zip(unique, await gather_all([self.score(*row) for row in unique]), strict=True))
        return [graded[row] for row in rows]

    async def score(self, prompt: Any, completion: Any, reference: Any = None) -> float:
        """The judge's grade of one completion in [0, 1]."""
        prompt_text, completion_text = render(prompt), render(completion)
        ref = None if reference is None else render(reference)
        key = ("pointwise", self.model, self.rubric, prompt_text, completion_text, ref)
        user = sections(prompt_text, ref, [("Response to grade", completion_text)])
        messages = [
            {"role": "system", "content": f"{self.rubric}\n\n{POINTWISE_FORMAT}"},
            {"role": "user", "content": user},
        ]
        value: float = await self._grade(key, messages, parse_score, "a line 'SCORE: N' with N from 0 to 10")
        return value

    def metrics(self) -> dict[str, float]:
        """Counters since construction: ``judge/requests`` sent, ``judge/cache_hits``, ``judge/reasked`` (no score)."""
        with self._count_lock:
            return {f"{self.name}/{k}": float(v) for k, v in self._counts.items()}

    async def aclose(self) -> None:
        """Close this event loop's connection pool (the others close with their loops)."""
        await self._http.aclose()

    # ------------------------------------------------------------------ one grade
    async def _grade(
        self, key: Hashable, messages: list[dict[str, str]], parse: Callable[[str], Any], expected: str
    ) -> Any:
        """Ask until ``parse`` reads the answer (at most ``retries`` more times); cached by ``key``."""
        cached = self._cache.get(key)
        if cached is not None:
            self._count("cache_hits")
            return cached
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self._count("reasked")
                await asyncio.sleep(backoff(self.backoff_s, attempt - 1))
            async with self._slots:
                self._count("requests")
                answer = await self._http.request(
                    "POST", "/chat/completions", body, safe=True, retry_status=_RETRY_STATUS, check=False
                )
            text, cut = self._reply(answer)
            value = parse(text) if text is not None else None
            if value is not None:
                self._cache.put(key, value)
                return value
            last = (text if text is not None else answer.text) + (" [cut at max_tokens]" if cut else "")
        hint = "; raise max_tokens" if last.endswith("[cut at max_tokens]") else ""
        raise EnvInfraError(
            f"LLM judge {self.base_url} (model {self.model!r}) gave no parseable score in "
            f"{self.retries + 1} attempt(s): expected {expected}{hint}; its last answer: {shown(last)}"
        )

    def _reply(self, answer: Answer) -> tuple[str | None, bool]:
        """The reply's text (None when the body is no chat completion) and whether it was cut by max_tokens."""
        if answer.status >= 400:
            raise self._refused(answer)
        try:
            choice = answer.json()["choices"][0]
            return content_text(choice["message"].get("content")), choice.get("finish_reason") == "length"
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return None, False

    def _refused(self, answer: Answer) -> EnvInfraError | RewardFunctionError:
        """An error answer: 429/5xx is the infrastructure's failure, any other 4xx a configuration error."""
        said = ErrorAnswer.read(answer.status, answer.body).message
        where = f"LLM judge {self.base_url}/chat/completions (model {self.model!r})"
        if answer.status in _RETRY_STATUS or answer.status >= 500:
            return EnvInfraError(
                f"{where} answered {answer.status} in {self.retries + 1} attempt(s): {shown(said)}"
            )
        if answer.status in (401, 403):
            fix = "check the API key (api_key_env names the environment variable holding it)"
        elif answer.status == 404:
            fix = f"check the model name (GET {self.base_url}/models lists them) and that url is the API's base URL (ending in /v1)"
        else:
            fix = "check the judge's options (model, max_tokens) against what the server accepts"
        return RewardFunctionError(f"{where} answered {answer.status}: {said}; {fix}")

    def _no_answer(self, failure: Failure) -> EnvInfraError:
        what = {
            "timeout": f"passed its deadline of {failure.timeout_s:g} s",
            "transport": "dropped the connection",
        }
        cause = f"{failure.name}: {failure.error}" if str(failure.error) else failure.name
        return EnvInfraError(
            f"LLM judge {self.base_url}/chat/completions (model {self.model!r}) "
            f"{what.get(failure.kind, 'could not be reached')} in {failure.attempts} attempt(s) ({cause}); "
            f"is the judge server up? (timeout_s={self.timeout_s:g}, retries={self.retries})"
        )

    def _count(self, what: str) -> None:
        with self._count_lock:
            self._counts[what] += 1

    def _references(
        self, completions: Sequence[Any], prompts: Sequence[Any], columns: Mapping[str, Any]
    ) -> list[Any]:
        """The reference answer of each row (None where there is none); checks one prompt per completion."""
        n = len(completions)
        if len(prompts) != n:
            raise RewardFunctionError(
                f"judge called with {n} completions and {len(prompts)} prompts; a reward function gets one prompt per completion"
            )
        names = [self.column] if self.column else [c for c in REFERENCE_COLUMNS if c in columns]
        if not names:
            return [None] * n
        if names[0] not in columns:
            raise RewardFunctionError(
                f"judge option column={names[0]!r} is not a column of the dataset "
                f"(columns: {sorted(columns)}); name one of them, or leave it unset"
            )
        values = columns[names[0]]
        if isinstance(values, str) or not isinstance(values, Sequence) or len(values) != n:
            raise RewardFunctionError(
                f"judge column {names[0]!r} must hold one value per completion ({n}); got {shown(repr(values))}"
            )
        return list(values)


class GroupJudgeReward(JudgeReward):
    """An LLM judge grading the completions of one prompt together, relative to each other, in one request.

    Called as a reward function, it splits the batch into groups by (prompt, reference) and
    grades each group with :meth:`score_group`; same options, deadlines, retries and failure
    classes as :class:`JudgeReward`. Scores are relative: the same completion may score
    differently beside other completions.
    """

    group_reward = True  # the dataset env hands it a task's G completions together (groups.py)

    mode: ClassVar[str] = "group"

    async def __call__(
        self, completions: Sequence[Any], prompts: Sequence[Any], **columns: Any
    ) -> list[float]:
        refs = self._references(completions, prompts, columns)
        groups: dict[tuple[str, str | None], list[int]] = {}
        for i, (p, r) in enumerate(zip(prompts, refs, strict=True)):
            groups.setdefault((render(p), None if r is None else render(r)), []).append(i)
        graded = await gather_all(
            [self.score_group(p, [completions[i] for i in rows], r) for (p, r), rows in groups.items()]
        )
        out = [0.0] * len(completions)
        for rows, scores in zip(groups.values(), graded, strict=True):
            for i, s in zip(rows, scores, strict=True):
                out[i] = s
        return out

    async def score_group(
        self, prompt: Any, completions: Sequence[Any], reference: Any = None
    ) -> list[float]:
        """One grade in [0, 1] per completion of ``prompt``, given relative to each other."""
        if not completions:
            return []
        prompt_text, texts = render(prompt), tuple(render(c) for c in completions)
        ref = None if reference is None else render(reference)
        n = len(texts)
        key = ("group", self.model, self.rubric, prompt_text, texts, ref)
        user = sections(prompt_text, ref, [(f"Response {i}", t) for i, t in enumerate(texts, 1)])
        system = f"{self.rubric}\n\n{GROUP_FORMAT.format(n=n)}"
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        scores: list[float] = await self._grade(
            key,
            messages,
            lambda text: parse_group_scores(text, n),
            f"one line 'SCORE i: N' for each i in 1..{n}",
        )
        return list(scores)


def _env_key(name: str) -> str:
    import os

    key = os.environ.get(name)
    if not key:
        raise RewardFunctionError(
            f"judge api_key_env={name!r}: the environment variable {name} is not set or empty; "
            f"export {name}=<your key>, or leave api_key_env unset for a server that needs no key"
        )
    return key


# ---------------------------------------------------------------------- options
_OPTIONS: dict[str, str] = {
    "url": "the API's base URL, e.g. http://127.0.0.1:8000/v1",
    "model": "the judge's model name as its server lists it",
    "rubric": "the grading instructions (text)",
    "rubric_file": "a file holding the rubric",
    "api_key_env": "the environment variable holding the API key",
    "concurrency": "the most requests in flight at once (>= 1)",
    "timeout_s": "the deadline of one request in seconds (> 0)",
    "retries": "more attempts after a failed one (>= 0)",
    "cache_size": "grades kept in the LRU cache (>= 0; 0 keeps none)",
    "mode": "pointwise | group",
    "temperature": "the judge's sampling temperature (>= 0)",
    "max_tokens": "the longest reply of the judge (>= 1)",
    "column": "the dataset column holding the reference answer",
}
"""The options :func:`judge_from_options` accepts, with what each is."""


def judge_from_options(options: Mapping[str, Any]) -> JudgeReward:
    """A judge from flat options (CLI or env kwargs; values may be strings); each is checked (see ``_OPTIONS``)."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        key = unknown[0]
        if key == "api_key":
            raise RewardFunctionError(
                "judge option api_key: keys are not passed as options (they would be saved with the run); "
                "export the key and pass api_key_env=NAME_OF_THE_VARIABLE"
            )
        near = difflib.get_close_matches(key, list(_OPTIONS), n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise RewardFunctionError(f"unknown judge option {key!r}; {hint}(known: {', '.join(_OPTIONS)})")
    for required in ("url", "model"):
        if not isinstance(options.get(required), str) or not options[required].strip():
            raise RewardFunctionError(
                f"judge option {required!r} is required ({_OPTIONS[required]}); got {options.get(required)!r}"
            )
    url = options["url"].strip()
    if not url.startswith(("http://", "https://")):
        raise RewardFunctionError(
            f"judge option url={url!r} is no http(s) URL; pass e.g. url=http://127.0.0.1:8000/v1"
        )
    mode = options.get("mode", "pointwise")
    if mode not in ("pointwise", "group"):
        raise RewardFunctionError(f"judge option mode={mode!r}; choose pointwise or group")
    cls = GroupJudgeReward if mode == "group" else JudgeReward
    kwargs: dict[str, Any] = {"rubric": _rubric(options)}
    for option, param, kind, low, strict in (
        ("concurrency", "max_concurrency", int, 1, False),
        ("timeout_s", "timeout_s", float, 0, True),
        ("retries", "retries", int, 0, False),
        ("cache_size", "cache_size", int, 0, False),
        ("temperature", "temperature", float, 0, False),
        ("max_tokens", "max_tokens", int, 1, False),
    ):
        if option in options:
            kwargs[param] = _number(option, options[option], kind, low, strict)
    for option in ("api_key_env", "column"):
        value = options.get(option)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise RewardFunctionError(
                f"judge option {option}={value!r}: pass {_OPTIONS[option]} as a non-empty name"
            )
        if value is not None:
            kwargs[option] = value.strip()
    return cls(url, options["model"].strip(), **kwargs)


def _rubric(options: Mapping[str, Any]) -> str:
    if "rubric" in options and "rubric_file" in options:
        raise RewardFunctionError("judge options rubric and rubric_file are both given; pass one")
    if "rubric_file" in options:
        path = Path(str(options["rubric_file"])).expanduser()
        try:
            text = path.read_text()
        except OSError as e:
            raise RewardFunctionError(
                f"judge option rubric_file={str(path)!r} cannot be read ({e}); pass a readable text file"
            ) from None
    else:
        text = options.get("rubric", DEFAULT_RUBRIC)
    if not isinstance(text, str) or not text.strip():
        raise RewardFunctionError(
            f"judge rubric is empty or not text ({text!r}); write the grading instructions, or leave it unset for the default"
        )
    return text.strip()


def _number(option: str, value: Any, kind: type[int] | type[float], low: float, strict: bool) -> Any:
    """``value`` (a number or its text) as ``kind``, at least ``low`` (above it when ``strict``)."""
    number: float | None = None
    whole = not isinstance(value, float) or value.is_integer()  # an int option takes 3.0, not 3.5
    if isinstance(value, int | float | str) and not isinstance(value, bool) and (kind is float or whole):
        try:
            number = kind(value.strip() if isinstance(value, str) else value)
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or number < low or (strict and number == low):
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise RewardFunctionError(
            f"judge option {option}={value!r}: expected {'an integer' if kind is int else 'a number'} {bound} "
            f"({_OPTIONS[option]})"
        )
    return number
