"""The ``[algo]`` section of `agentrl train`: the RL objective's knobs (advantage estimator, policy
loss, regularisers, the off-policy correction), read by :mod:`agentrl.trainer.algorithm`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentrl.configlib import fail as _fail

__all__ = ["AlgoConfig"]

AdvantageKind = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"]
PolicyLossKind = Literal["ppo", "gspo", "cispo"]
AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
KLEstimator = Literal["k1", "k2", "k3", "k3+"]
RolloutCorrection = Literal["none", "tis", "mis", "icepop"]
CorrectionLevel = Literal["token", "sequence"]
AdvantageLevel = Literal["episode", "turn"]


@dataclass(frozen=True)
class AlgoConfig:
    """The RL algorithm: advantage estimator, policy loss and regularisers."""

    algo: Literal["grpo", "ppo"] = "grpo"
    """'grpo' (critic-free, group baselines) or 'ppo' (value head + GAE)"""
    advantage: AdvantageKind | Literal["auto"] = "auto"
    """grpo | dr_grpo | rloo | reinforce_pp | gae; 'auto' = grpo for GRPO, gae for PPO"""
    policy_loss: PolicyLossKind = "ppo"
    """ppo (clipped ratio) | gspo (sequence ratio) | cispo (clipped IS weight)"""
    clip_low: float | None = None
    """lower clip range: ratio >= 1 - clip_low; unset = 0.2, or 3e-4 for gspo (its sequence ratios move ~1e-2)"""
    clip_high: float | None = None
    """upper clip range: ratio <= 1 + clip_high (clip-higher when > clip_low, DAPO); unset = 0.28, or 4e-4 for gspo"""
    dual_clip: float = 3.0
    """ppo: dual-clip constant c > 1 bounding the loss of a negative-advantage token by -c A (0 = off)"""
    loss_agg: AggMode = "token-mean"
    """how per-token losses become one number: token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm (Dr.GRPO: token sums over episodes x max_new_tokens)"""
    kl_coef: float = 0.0
    """weight of the KL penalty to the reference (initial) model; 0 = off, no reference copy"""
    kl_estimator: KLEstimator = "k3+"
    """KL(pi || ref) estimate used as a loss: k3+ (k3's value, k2's gradient: grad KL(pi || ref)) | k2 (half squared log ratio; grad KL(pi || ref)) | k3 (unbiased value, but its gradient is grad KL(ref || pi)) | k1 (log ratio; zero expected gradient)"""
    entropy_coef: float = 0.0
    """entropy bonus weight"""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal (zero advantage), then play new tasks in their place"""
    max_refill_rounds: int | None = None
    """dynamic sampling: at most this many rounds of new tasks a step, played until it has tasks_per_step informative groups (DAPO); unset = 3, 0 = no refill; synchronous rollout only (max_staleness 0)"""
    overlong_buffer: int = 0
    """DAPO: penalise completions within this many tokens of max_new_tokens (0 = off)"""
    overlong_penalty: float = 1.0
    """DAPO: maximum overlong penalty, reached at max_new_tokens"""
    gamma: float = 1.0
    """PPO/GAE discount"""
    lam: float = 0.95
    """PPO/GAE lambda"""
    value_clip: float = 0.2
    """PPO: clip range of the value loss"""
    vf_coef: float = 0.5
    """PPO: weight of the value loss"""
    epochs: int = 1
    """passes over each batch"""
    num_minibatches: int = 1
    """optimizer updates per pass; the batch must split evenly"""
    decoupled: bool = False
    """decoupled PPO: clip against the weights at the start of the update (one extra no-grad forward) and weight each token by pi_prox / pi_behaviour"""
    rollout_correction: RolloutCorrection = "none"
    """decoupled PPO's behaviour weight: none (as is) | tis (truncated at is_cap) | mis (masked outside [is_low, is_high]) | icepop (token mask, band [0.5, 5] by default)"""
    correction_level: CorrectionLevel = "token"
    """tis/mis: the ratio per token, or per sequence (the geometric mean of its tokens' ratios)"""
    is_cap: float = 2.0
    """tis: the behaviour weight is truncated at this C"""
    is_low: float | None = None
    """mis/icepop: tokens (sequences) with a ratio below this leave the loss; unset = 0.5"""
    is_high: float | None = None
    """mis/icepop: tokens (sequences) with a ratio above this leave the loss; unset = 2.0 for mis, 5.0 for icepop"""
    advantage_level: AdvantageLevel = "episode"
    """episode: the env's per-turn rewards summed, one advantage for every token of the episode | turn: each assistant turn's tokens get their own (group estimators: the turn's discounted return-to-go against the same turn of the group's other episodes; PPO: each turn's reward on its last token)"""
    turn_gamma: float = 1.0
    """--advantage-level turn with a group estimator: discount across assistant turns, G_t = sum_k>=t turn_gamma^(k-t) r_k"""

    def __post_init__(self) -> None:
        low, high = self.clip
        if low <= 0 or low >= 1 or high <= 0:
            _fail("algo", "clip_low/clip_high", (low, high), "need 0 < clip_low < 1, clip_high > 0")
        if self.max_refill_rounds is not None and self.max_refill_rounds < 0:
            _fail("algo", "max_refill_rounds", self.max_refill_rounds, "must be >= 0 (0 = no refill)")
        if self.max_refill_rounds and not self.dynamic_sampling:
            _fail("algo", "max_refill_rounds", self.max_refill_rounds, "refills the groups dynamic sampling "
                  "drops; add --dynamic-sampling, or leave it unset")  # fmt: skip
        if self.dual_clip != 0 and self.dual_clip <= 1:
            _fail("algo", "dual_clip", self.dual_clip, "must be > 1 (e.g. 3.0) or 0 to disable")
        if self.kl_coef < 0 or self.entropy_coef < 0 or self.vf_coef < 0:
            _fail(
                "algo",
                "kl_coef/entropy_coef/vf_coef",
                (self.kl_coef, self.entropy_coef, self.vf_coef),
                "must be >= 0",
            )
        if self.overlong_buffer < 0:
            _fail("algo", "overlong_buffer", self.overlong_buffer, "must be >= 0")
        if not 0 <= self.gamma <= 1 or not 0 <= self.lam <= 1:
            _fail("algo", "gamma/lam", (self.gamma, self.lam), "must lie in [0, 1]")
        if self.epochs < 1 or self.num_minibatches < 1:
            _fail("algo", "epochs/num_minibatches", (self.epochs, self.num_minibatches), "must be >= 1")
        if self.algo == "grpo" and self.advantage == "gae":
            _fail("algo", "advantage", self.advantage, "GAE needs a critic: use --algo ppo")
        if self.algo == "ppo" and self.advantage not in ("auto", "gae"):
            _fail("algo", "advantage", self.advantage, "PPO uses GAE; use --algo grpo for group baselines")
        self._check_correction()
        self._check_turn_credit()

    def _check_turn_credit(self) -> None:
        """``turn_gamma`` applies only where it is read: turn-level credit with a group estimator."""
        if not 0 <= self.turn_gamma <= 1:
            _fail("algo", "turn_gamma", self.turn_gamma, "must lie in [0, 1]")
        if self.turn_gamma != 1 and self.advantage_level != "turn":
            _fail(
                "algo",
                "turn_gamma",
                self.turn_gamma,
                "discounts per-turn returns, which only --advantage-level turn computes; add it or drop --turn-gamma",
            )
        if self.turn_gamma != 1 and self.advantage_kind == "gae":
            _fail(
                "algo",
                "turn_gamma",
                self.turn_gamma,
                "PPO discounts per token with --gamma (GAE); leave --turn-gamma at 1 with --algo ppo",
            )

    def _check_correction(self) -> None:
        """The off-policy correction's options agree with each other (see agentrl.trainer.offpolicy)."""
        c = self.rollout_correction
        if c != "none" and not self.decoupled:
            _fail(
                "algo",
                "rollout_correction",
                c,
                "corrects the behaviour weight pi_prox / pi_behaviour of decoupled PPO; add --decoupled",
            )
        if c == "icepop" and self.correction_level != "token":
            _fail(
                "algo",
                "correction_level",
                self.correction_level,
                "icepop masks single tokens; use --correction-level token, or --rollout-correction mis",
            )
        if self.is_cap < 1:
            _fail("algo", "is_cap", self.is_cap, "must be >= 1 (a cap below 1 down-weights on-policy tokens)")
        low, high = self.is_bounds
        if not 0 <= low <= 1 <= high:
            _fail(
                "algo",
                "is_low/is_high",
                (self.is_low, self.is_high),
                "need 0 <= is_low <= 1 <= is_high (the band must keep on-policy tokens, ratio 1)",
            )

    @property
    def clip(self) -> tuple[float, float]:
        """The clip range ``(clip_low, clip_high)`` with the unset ones the policy loss's own default.

        GSPO clips a sequence's geometric-mean ratio, which moves ~1e-2 per update where token ratios
        move ~1e-1, so it takes the GSPO paper's 3e-4 / 4e-4 (Zheng et al. 2025); ppo and cispo
        take 0.2 / 0.28 (clip-higher, DAPO).
        """
        low, high = (3e-4, 4e-4) if self.policy_loss == "gspo" else (0.2, 0.28)
        return (low if self.clip_low is None else self.clip_low), (
            high if self.clip_high is None else self.clip_high
        )

    @property
    def refill_rounds(self) -> int:
        """``max_refill_rounds`` resolved: 0 without dynamic sampling, 3 when unset."""
        if not self.dynamic_sampling:
            return 0
        return 3 if self.max_refill_rounds is None else self.max_refill_rounds

    @property
    def is_bounds(self) -> tuple[float, float]:
        """The mis/icepop band ``[is_low, is_high]`` with the unset bounds derived."""
        low = 0.5 if self.is_low is None else self.is_low
        if self.is_high is not None:
            return low, self.is_high
        return low, 5.0 if self.rollout_correction == "icepop" else 2.0

    @property
    def advantage_kind(self) -> AdvantageKind:
        if self.advantage == "auto":
            return "gae" if self.algo == "ppo" else "grpo"
        return self.advantage
