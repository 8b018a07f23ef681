"""Training configuration: frozen dataclasses that are the one source of truth.

Every option lives once, as a field with its default and a one-line docstring
under it. :func:`add_cli_flags` generates the ``agentrl train`` flags from the
fields (``group_size`` becomes ``--group-size``), :func:`load_toml` reads a
``run.toml`` whose tables mirror the sections (``[rollout]``, ``[algo]``, ...),
and :func:`resolve` merges defaults < TOML < flags given on the command line.
Unknown keys are errors that name the key; cross-field checks (GRPO needs a
group of at least 2, the batch must split into mini-batches, ...) run in
``__post_init__``, i.e. before any model is loaded.
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import difflib
import inspect
import json
import sys
import tomllib
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from agentrl.errors import ConfigError

__all__ = [
    "AlgoConfig",
    "ModelConfig",
    "OptimConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainConfig",
    "add_cli_flags",
    "field_help",
    "load_toml",
    "resolve",
    "to_dict",
    "to_toml",
]

AdvantageKind = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"]
PolicyLossKind = Literal["ppo", "gspo", "cispo"]
AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
KLEstimator = Literal["k1", "k2", "k3"]
SyncKind = Literal["auto", "inprocess", "disk", "broadcast"]


def _fail(section: str, name: str, value: Any, why: str) -> None:
    raise ConfigError(f"{section}.{name}={value!r}: {why}")


@dataclass(frozen=True)
class ModelConfig:
    """Which model is trained and how it is placed."""

    model: str = "tiny"
    """model name (resolved by agentrl.models) or a local HF directory"""
    device: str = "auto"
    """'cpu', 'cuda' or 'auto' (cuda when available)"""
    threads: int = 2
    """torch intra-op threads on CPU (0 leaves torch's default)"""
    activation_checkpointing: bool = False
    """recompute decoder-layer activations in backward to save memory"""
    cpu_offload: bool = False
    """FSDP2 CPUOffloadPolicy: keep parameters and optimizer state on the host (GPU only)"""
    share_prompts: bool = True
    """in the update, run the forward of a prompt that several episodes share (a group) once (not yet under torchrun)"""

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda", "auto"):
            _fail("model", "device", self.device, "use 'cpu', 'cuda' or 'auto'")
        if self.threads < 0:
            _fail("model", "threads", self.threads, "must be >= 0")


@dataclass(frozen=True)
class RolloutConfig:
    """Where episodes come from and how they are sampled."""

    env: str = "countdown"
    """environment name (see `agentrl envs`)"""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """keyword arguments for the env constructor (JSON object); empty = the env's demo preset (registered with the env), if any"""
    env_url: str = ""
    """URL of a remote env server; empty runs the env in-process"""
    session_url: str = ""
    """URL of a session server; empty uses the in-process session manager"""
    group_size: int = 8
    """G: episodes per task (a GRPO group)"""
    tasks_per_step: int = 8
    """tasks (groups) per train step; the batch is tasks_per_step * group_size episodes"""
    max_new_tokens: int = 32
    """token budget of one assistant turn"""
    max_turns: int | None = None
    """assistant turns per episode before it is truncated; unset = the env's own max_turns (fewer cuts episodes shorter, more is an error)"""
    temperature: float = 1.0
    """sampling temperature for training rollouts (eval is greedy)"""
    max_infra_retries: int = 2
    """retries of an episode that failed for infrastructure reasons, on a fresh env"""
    episode_timeout_s: float = 120.0
    """deadline for one episode; past it the episode counts as an infrastructure failure"""
    max_staleness: int = 0
    """asynchronous rollout: play the next K steps' episodes while the trainer updates, so a token is at most K policy versions old when trained on (0: synchronous, every step rolls out with the latest weights)"""
    eval_every: int = 5
    """evaluate on held-out seeds every N train steps (0: only at start and end)"""
    eval_episodes: int = 64
    """number of held-out seeds per evaluation"""
    eval_seed_offset: int = 1_000_000
    """held-out seeds start here; training seeds count up from 0 and never reach it"""

    def __post_init__(self) -> None:
        for name in ("group_size", "tasks_per_step", "max_new_tokens", "eval_episodes"):
            if getattr(self, name) < 1:
                _fail("rollout", name, getattr(self, name), "must be >= 1")
        if self.max_turns is not None and self.max_turns < 1:
            _fail("rollout", "max_turns", self.max_turns, "must be >= 1 (or unset: the env's own max_turns)")
        if self.temperature < 0:
            _fail("rollout", "temperature", self.temperature, "must be >= 0")
        for name in ("max_infra_retries", "eval_every", "max_staleness"):
            if getattr(self, name) < 0:
                _fail("rollout", name, getattr(self, name), "must be >= 0")
        if not isinstance(self.env_kwargs, dict):
            _fail("rollout", "env_kwargs", self.env_kwargs, "must be a table / JSON object")


@dataclass(frozen=True)
class AlgoConfig:
    """The RL algorithm: advantage estimator, policy loss and regularisers."""

    algo: Literal["grpo", "ppo"] = "grpo"
    """'grpo' (critic-free, group baselines) or 'ppo' (value head + GAE)"""
    advantage: AdvantageKind | Literal["auto"] = "auto"
    """grpo | dr_grpo | rloo | reinforce_pp | gae; 'auto' = grpo for GRPO, gae for PPO"""
    policy_loss: PolicyLossKind = "ppo"
    """ppo (clipped ratio) | gspo (sequence ratio) | cispo (clipped IS weight)"""
    clip_low: float = 0.2
    """lower clip range: ratio >= 1 - clip_low"""
    clip_high: float = 0.28
    """upper clip range: ratio <= 1 + clip_high (clip-higher when > clip_low, DAPO)"""
    dual_clip: float = 0.0
    """dual-clip constant c > 1 bounding the loss for negative advantages (0 = off)"""
    loss_agg: AggMode = "token-mean"
    """how per-token losses become one number"""
    kl_coef: float = 0.0
    """weight of the KL penalty to the reference (initial) model; 0 = off, no reference copy"""
    kl_estimator: KLEstimator = "k3"
    """k1 (log ratio), k2 (half squared log ratio) or k3 (unbiased, low variance)"""
    entropy_coef: float = 0.0
    """entropy bonus weight"""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal (zero advantage)"""
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

    def __post_init__(self) -> None:
        if self.clip_low <= 0 or self.clip_low >= 1 or self.clip_high <= 0:
            _fail(
                "algo",
                "clip_low/clip_high",
                (self.clip_low, self.clip_high),
                "need 0 < clip_low < 1, clip_high > 0",
            )
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

    @property
    def advantage_kind(self) -> AdvantageKind:
        if self.advantage == "auto":
            return "gae" if self.algo == "ppo" else "grpo"
        return self.advantage


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and micro-batching."""

    lr: float = 5e-5
    """AdamW learning rate of the RL phase"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    grad_clip: float = 1.0
    """clip the global gradient norm to this (0 = off)"""
    warmup_steps: int = 0
    """linear learning-rate warm-up, in optimizer updates"""
    micro_batch_tokens: int = 8192
    """token budget of one forward/backward micro-batch (padded tokens)"""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            _fail("optim", "lr", self.lr, "must be > 0")
        if self.grad_clip < 0 or self.weight_decay < 0 or self.warmup_steps < 0:
            _fail(
                "optim",
                "grad_clip/weight_decay/warmup_steps",
                (self.grad_clip, self.weight_decay, self.warmup_steps),
                "must be >= 0",
            )
        if self.micro_batch_tokens < 16:
            _fail("optim", "micro_batch_tokens", self.micro_batch_tokens, "must be >= 16")


@dataclass(frozen=True)
class RunConfig:
    """Length of the run, the supervised warm start, outputs and checkpoints."""

    steps: int = 30
    """RL train steps"""
    seed: int = 0
    """seed of torch, sampling and task order"""
    sft_steps: int = 60
    """supervised warm-start steps on oracle solutions before RL (0 = none)"""
    sft_batch_size: int = 16
    """oracle episodes per warm-start step"""
    sft_lr: float = 2e-3
    """AdamW learning rate of the warm start"""
    run_dir: str = ""
    """output directory; empty = $AGENTRL_HOME/runs/<env>-<time>"""
    checkpoint_every: int = 0
    """save a resumable checkpoint every N steps (0: only at the end)"""
    resume: str = ""
    """resume from this checkpoint directory (a run_dir/checkpoints/step-N)"""
    weight_sync: SyncKind = "auto"
    """inprocess (copy tensors), disk (safetensors + reload), broadcast (torch.distributed); auto = disk with session_url, else inprocess"""
    tensorboard: bool = True
    """also write TensorBoard event files"""
    wandb: bool = False
    """also log to Weights & Biases (needs the wandb extra)"""
    progress: bool = True
    """show a rich progress bar"""

    def __post_init__(self) -> None:
        for name in ("steps", "sft_steps", "checkpoint_every"):
            if getattr(self, name) < 0:
                _fail("run", name, getattr(self, name), "must be >= 0")
        if self.sft_batch_size < 1 or self.sft_lr <= 0:
            _fail("run", "sft_batch_size/sft_lr", (self.sft_batch_size, self.sft_lr), "must be > 0")


@dataclass(frozen=True)
class TrainConfig:
    """The whole configuration of `agentrl train`, one table per section."""

    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        a, r = self.algo, self.rollout
        if a.algo == "grpo" and a.advantage_kind in ("grpo", "dr_grpo", "rloo") and r.group_size < 2:
            _fail(
                "rollout",
                "group_size",
                r.group_size,
                f"{a.advantage_kind} needs a group of at least 2 episodes per task",
            )
        batch = r.tasks_per_step * r.group_size
        if batch % a.num_minibatches:
            _fail(
                "algo",
                "num_minibatches",
                a.num_minibatches,
                f"the batch of tasks_per_step*group_size = {r.tasks_per_step}*{r.group_size} = {batch} "
                "episodes does not split evenly; pick a divisor",
            )
        if a.overlong_buffer >= r.max_new_tokens and a.overlong_buffer:
            _fail(
                "algo", "overlong_buffer", a.overlong_buffer, f"must be < max_new_tokens={r.max_new_tokens}"
            )
        if self.run.weight_sync == "auto":
            object.__setattr__(
                self,
                "run",
                dataclasses.replace(self.run, weight_sync="disk" if r.session_url else "inprocess"),
            )
        if r.session_url and self.run.weight_sync == "inprocess":
            _fail(
                "run",
                "weight_sync",
                self.run.weight_sync,
                f"cannot reach the engine of rollout.session_url={r.session_url!r}, which runs in another "
                "process; use --weight-sync disk (the server loads the safetensors the trainer writes: same "
                "machine or a shared file system) or --weight-sync broadcast (torch.distributed)",
            )

    @property
    def batch_size(self) -> int:
        return self.rollout.tasks_per_step * self.rollout.group_size


SECTIONS: tuple[tuple[str, type], ...] = tuple((f.name, f.default_factory) for f in fields(TrainConfig))  # type: ignore[misc]


# ---------------------------------------------------------------- introspection


def field_help(cls: type) -> dict[str, str]:
    """The docstring under each field of ``cls`` (parsed from its source)."""
    try:
        tree = ast.parse(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in zip(body, body[1:], strict=False):
        is_field = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        is_doc = (
            isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        )
        if is_field and is_doc:
            out[node.target.id] = nxt.value.value.strip()
    return out


def _leaf_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(sys.modules[__name__]))


def _base(tp: Any) -> tuple[Any, tuple[Any, ...] | None]:
    """(python type, literal choices or None) of an annotation."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        vals = typing.get_args(tp)
        return type(vals[0]), vals
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:  # Optional[X]: X, and None means "unset"
            return _base(args[0])
        choices: list[Any] = []
        for arg in args:
            t, c = _base(arg)
            choices.extend(c or ())
        return str, tuple(choices) or None
    if origin is dict or tp is dict:
        return dict, None
    return tp, None


def _coerce(section: str, name: str, tp: Any, value: Any) -> Any:
    if value is None and type(None) in typing.get_args(tp):
        return None
    base, choices = _base(tp)
    where = f"{section}.{name}"
    if base is dict:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{where}: expected a JSON object, got {value!r} ({e})") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table / JSON object, got {value!r}")
        return value
    if base is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, base) or isinstance(value, bool) and base is not bool:
        raise ConfigError(f"{where}: expected {base.__name__}, got {value!r} ({type(value).__name__})")
    if choices is not None and value not in choices:
        raise ConfigError(f"{where}={value!r}: choose one of {', '.join(map(repr, choices))}")
    return value


def _unknown(key: str, known: list[str], where: str) -> ConfigError:
    best = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {best[0]!r}?" if best else f"; known keys: {', '.join(known)}"
    return ConfigError(f"unknown key {key!r} in {where}{hint}")


def _build(values: dict[str, dict[str, Any]]) -> TrainConfig:
    parts = {}
    for sec, cls in SECTIONS:
        hints = _leaf_types(cls)
        given = values.get(sec, {})
        kw = {k: _coerce(sec, k, hints[k], v) for k, v in given.items()}
        parts[sec] = cls(**kw)
    return TrainConfig(**parts)


# ---------------------------------------------------------------- TOML, CLI


def load_toml(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a ``run.toml`` into ``{section: {key: value}}``, rejecting unknown tables and keys."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {str(p)!r} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {e}") from None
    sections = dict(SECTIONS)
    out: dict[str, dict[str, Any]] = {}
    for sec, table in data.items():
        if sec not in sections:
            raise _unknown(sec, list(sections), f"{p.name} (top-level tables are sections)")
        if not isinstance(table, dict):
            raise ConfigError(f"{p.name}: {sec!r} must be a table ([{sec}]), got {table!r}")
        known = [f.name for f in fields(sections[sec])]
        for key in table:
            if key not in known:
                raise _unknown(key, known, f"{p.name} [{sec}]")
        out[sec] = dict(table)
    return out


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_cli_flags(parser: argparse.ArgumentParser, sections: tuple[str, ...] | None = None) -> None:
    """Add one flag per config field (``--group-size``), grouped by section, plus ``--config``.

    Flags default to "not given" so that :func:`resolve` can layer them over a TOML file.
    """
    parser.add_argument(
        "--config", default=None, metavar="RUN.TOML", help="read options from a TOML file first"
    )
    for sec, cls in SECTIONS:
        if sections is not None and sec not in sections:
            continue
        group = parser.add_argument_group(sec, (cls.__doc__ or "").strip())
        helps = field_help(cls)
        hints = _leaf_types(cls)
        defaults = cls()
        for f in fields(cls):
            base, choices = _base(hints[f.name])
            default = getattr(defaults, f.name)
            text = f"{helps.get(f.name, '')} (default: {json.dumps(default) if base is dict else default!r})"
            kw: dict[str, Any] = {
                "dest": f"{sec}.{f.name}",
                "default": argparse.SUPPRESS,
                "help": text.replace("%", "%%"),
            }
            if base is bool:
                kw["action"] = argparse.BooleanOptionalAction
            elif base is dict:
                kw["metavar"] = "JSON"
            else:
                kw["type"] = base
                kw["metavar"] = "{" + ",".join(map(str, choices)) + "}" if choices else f.name.upper()
                if choices:
                    kw["choices"] = choices
            group.add_argument(_flag(f.name), **kw)


def resolve(
    args: argparse.Namespace | None = None, *, toml: str | Path | None = None, **overrides: Any
) -> TrainConfig:
    """Defaults < TOML file < CLI flags < ``overrides`` (``section.key`` or unique bare keys)."""
    values: dict[str, dict[str, Any]] = {sec: {} for sec, _ in SECTIONS}
    path = toml if toml is not None else getattr(args, "config", None) if args is not None else None
    if path:
        for sec, table in load_toml(path).items():
            values[sec].update(table)
    if args is not None:
        for dest, v in vars(args).items():
            if "." in dest:
                sec, key = dest.split(".", 1)
                if sec in values:
                    values[sec][key] = v
    owner = {f.name: sec for sec, cls in SECTIONS for f in fields(cls)}
    for key, v in overrides.items():
        sec, _, name = key.rpartition(".")
        if not sec:
            if key not in owner:
                raise _unknown(key, sorted(owner), "overrides")
            sec, name = owner[key], key
        values[sec][name] = v
    _apply_preset(values)
    return _build(values)


def _apply_preset(values: dict[str, dict[str, Any]]) -> None:
    """Fill the keys the user left out from the env's registered ``demo_preset`` (only without env_kwargs).

    The preset is the difficulty and run length at which the default tiny model, from random
    weights, learns the task within the few-minute CPU demo; an explicit ``--env-kwargs``
    (any JSON object) turns the whole preset off. An env this process does not know (e.g.
    one served at ``--env-url`` only) has no preset; ``make_env_factory`` names a local typo.
    """
    from agentrl.envs import spec
    from agentrl.envs.errors import UnknownEnvError

    rollout = values["rollout"]
    if rollout.get("env_kwargs"):
        return
    env = rollout.get("env", RolloutConfig.env)
    if not isinstance(env, str):
        return  # _build reports the type error
    try:
        found = spec(env)  # countdown and countdown-v0 alike
    except UnknownEnvError:
        return
    sections = dict(SECTIONS)
    for sec, table in found.demo_preset.items():
        if sec not in sections:
            raise _unknown(sec, list(sections), f"the demo_preset of env {found.id!r}")
        known = [f.name for f in fields(sections[sec])]
        for key, v in table.items():
            if key not in known:
                raise _unknown(key, known, f"the demo_preset of env {found.id!r} [{sec}]")
            values[sec].setdefault(key, copy.deepcopy(v))


def to_dict(cfg: TrainConfig) -> dict[str, dict[str, Any]]:
    return dataclasses.asdict(cfg)


def to_toml(cfg: TrainConfig) -> str:
    """Render the resolved config as TOML that :func:`load_toml` reads back to the same config."""
    lines: list[str] = []
    for sec, table in to_dict(cfg).items():
        lines.append(f"[{sec}]")
        for k, v in table.items():
            # TOML has no null: an unset optional field is left out, so it reads back unset
            lines.append(f"# {k} is unset" if v is None else f"{k} = {_toml_value(v)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ConfigError(f"cannot write {v!r} to TOML")
