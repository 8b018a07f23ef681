"""The simulated model behind :class:`~agentrl.engines.simulated.SimulatedEngine`: one categorical.

:class:`SimulatedLM` holds the model's one weight, a logits vector ``(V,)`` that is the
next-token logits at every position, whatever the context. :class:`Distribution` is that
categorical under one sampling setting (temperature, top-k, top-p, greedy, as
:func:`~agentrl.engines.sampling.filtered_logprobs` defines them), ready for inverse-CDF draws
of one uniform each. :class:`LogNormalLengths` is a request-length distribution for benchmarks.
Nothing here is a language model: it exists so that benchmarks can run without one.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from agentrl.engines.errors import WeightUpdateError
from agentrl.engines.sampling import SamplingBatch, filtered_logprobs
from agentrl.errors import ConfigError
from agentrl.types import SamplingParams

__all__ = ["Distribution", "LengthFn", "LogNormalLengths", "SimulatedLM", "check_logits", "zipf_logits"]

LengthFn = Callable[[random.Random], int]
"""A request's natural output length (stop token included), drawn from the request's own generator."""

_Z99 = 2.3263478740408408  # the standard normal's 99th percentile


@dataclass(frozen=True)
class LogNormalLengths:
    """Output lengths from a log-normal distribution given by its median and 99th percentile (tokens)."""

    median: float
    """Half of the requests stop before this many tokens."""
    p99: float
    """One request in a hundred runs longer than this."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median) and math.isfinite(self.p99) and 1 <= self.median <= self.p99):
            raise ConfigError(
                f"LogNormalLengths needs 1 <= median <= p99 (finite), got median={self.median}, p99={self.p99}"
            )

    def __call__(self, rng: random.Random) -> int:
        sigma = math.log(self.p99 / self.median) / _Z99
        return max(1, round(rng.lognormvariate(math.log(self.median), sigma)))


@dataclass
class _Output:
    logits: torch.Tensor


class SimulatedLM(torch.nn.Module):
    """The simulated model: one logits vector ``(V,)``, the next-token logits at every position.

    ``forward(input_ids (B, T))`` returns an object whose ``.logits`` is ``(B, T, V)``, as a
    causal LM's does, so it serves as ``check_engine``'s teacher-forced reference.
    """

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(logits.detach().float().clone(), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> _Output:
        b, t = input_ids.shape
        return _Output(self.logits.expand(b, t, -1))


def zipf_logits(vocab_size: int, seed: int, exponent: float = 1.1) -> torch.Tensor:
    """Logits ``(V,)`` of a Zipf distribution over a seeded permutation of the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    ranks = torch.randperm(vocab_size, generator=g).double() + 1.0
    return (-exponent * ranks.log()).float()


@dataclass
class Distribution:
    """One sampling setting's filtered distribution over the vocabulary, ready for inverse-CDF draws."""

    logprobs: list[float]
    cdf: list[float]
    argmax: int
    greedy: bool

    @classmethod
    def build(cls, logits: torch.Tensor, params: SamplingParams) -> Distribution:
        batch = SamplingBatch.build([params.temperature], [params.top_p], [params.top_k])
        logp = filtered_logprobs(logits[None], batch)[0]
        return cls(
            logprobs=logp.tolist(),
            cdf=logp.double().exp().cumsum(0).tolist(),
            argmax=int(logp.argmax()),
            greedy=params.temperature <= 0,
        )

    def draw(self, u: float) -> tuple[int, float]:
        """The token the uniform ``u`` selects (the argmax when greedy) and its logprob."""
        if self.greedy:
            return self.argmax, self.logprobs[self.argmax]
        i = bisect.bisect_right(self.cdf, u * self.cdf[-1])
        if i >= len(self.cdf) or self.logprobs[i] == -math.inf:  # rounding past the last kept token
            i = self.argmax
        return i, self.logprobs[i]


def check_logits(tensors: Mapping[str, torch.Tensor], vocab_size: int) -> None:
    """Reject logits that define no distribution (NaN, +inf, all -inf) or have the wrong shape."""
    t = tensors.get("logits")
    if t is None:
        return
    if tuple(t.shape) != (vocab_size,):
        raise WeightUpdateError(f"logits: shape {tuple(t.shape)}; expected ({vocab_size},)")
    t = t.detach().float()
    if bool(torch.isnan(t).any() | torch.isposinf(t).any()) or not bool(torch.isfinite(t).any()):
        raise WeightUpdateError("logits must be finite or -inf, with at least one finite entry")
