"""The run's configuration: the frozen dataclasses of `agentrl train` and how they are resolved.

Every option lives once, as a field with its default and a one-line docstring
under it, in one of seven sections (``[model]``, ``[rollout]``, ``[algo]``,
``[optim]``, ``[run]``, with ``[algo]`` in :mod:`agentrl.trainer.algo_config` and ``[cluster]`` in
:mod:`agentrl.trainer.cluster_config`, ``[data]`` in :mod:`agentrl.trainer.data_config`). The flags (``group_size`` becomes ``--group-size``), the
TOML reader and writer and the type checks are generated from the fields by
:mod:`agentrl.configlib`; this module adds what is the run's own: :func:`resolve`
merges defaults < the env's registered demo preset < TOML < flags given on the
command line < keyword overrides. Unknown keys are errors that name the key;
cross-field checks (GRPO needs a group of at least 2, the batch must split into
mini-batches, ...) run in ``__post_init__``, i.e. before any model is loaded.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentrl import configlib
from agentrl.configlib import fail as _fail
from agentrl.trainer.algo_config import AlgoConfig
from agentrl.trainer.cluster_config import ClusterConfig, check_ray
from agentrl.trainer.colocate import check_colocate
from agentrl.trainer.data_config import DataConfig, apply_dataset, check_data
from agentrl.trainer.engine_choice import choose_engine
from agentrl.trainer.loggers import log_targets
from agentrl.trainer.lora_config import LoraConfig, check_lora
from agentrl.trainer.parallel_config import ParallelConfig, check_parallel

if TYPE_CHECKING:
    from agentrl.envs import EnvSpec

__all__ = [
    "AlgoConfig",
    "ClusterConfig",
    "DataConfig",
    "LoraConfig",
    "ParallelConfig",
    "ModelConfig",
    "OptimConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainConfig",
    "add_cli_flags",
    "advisories",
    "field_help",
    "load_toml",
    "resolve",
    "to_dict",
    "to_toml",
]

SyncKind = Literal["auto", "inprocess", "disk", "broadcast", "ipc"]
EngineKind = Literal["auto", "hf", "vllm", "sglang"]


ENGINE_MAX_BATCH = 64
"""the embedded engine's default running batch (``--engine-max-batch``)"""


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
    engine: EngineKind = "auto"
    """rollout engine: auto (vllm, colocated, on a GPU with vLLM set up, else hf: agentrl/trainer/engine_choice.py), hf (embedded, in process), vllm (a vLLM server agentrl starts, or --engine-url), sglang (--engine-url, or started on a GPU machine)"""
    engine_url: str = ""
    """URL of an engine server already running (of --engine's kind); empty: agentrl starts one for vllm/sglang"""
    engine_python: str = ""
    """interpreter of the vLLM environment; empty: $AGENTRL_VLLM_PYTHON, else .venv-vllm (scripts/setup.sh --vllm)"""
    engine_startup_s: float = 600.0
    """deadline for a started engine server to answer /health"""
    engine_max_batch: int = ENGINE_MAX_BATCH
    """most requests the embedded engine decodes in one step; 1 makes every sampled token and logprob independent of what else runs, so a run is bit-for-bit reproducible (slower rollout)"""
    colocate: bool = False
    """vLLM on the trainer's GPU, asleep while the trainer updates, its memory share planned (--engine vllm; agentrl/trainer/colocate.py)"""

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda", "auto"):
            _fail("model", "device", self.device, "use 'cpu', 'cuda' or 'auto'")
        if self.engine in ("auto", "hf") and self.engine_url:
            _fail("model", "engine_url", self.engine_url, f"--engine {self.engine} starts no server to reach "
                  "there; say which server it is with --engine vllm or --engine sglang")  # fmt: skip
        if self.engine_url and not self.engine_url.startswith(("http://", "https://")):
            _fail("model", "engine_url", self.engine_url, "use an http:// or https:// URL")
        if self.engine_startup_s <= 0:
            _fail("model", "engine_startup_s", self.engine_startup_s, "must be > 0")
        if self.threads < 0:
            _fail("model", "threads", self.threads, "must be >= 0")
        if self.engine_max_batch < 1:
            _fail("model", "engine_max_batch", self.engine_max_batch, "must be >= 1")


@dataclass(frozen=True)
class RolloutConfig:
    """Where episodes come from and how they are sampled."""

    env: str = "countdown"
    """environment: a registered name (see `agentrl envs`), module:Class, or path/to/file.py:Class (registered on the fly)"""
    imports: list[str] = field(default_factory=list, metadata={"flag": "--import", "metavar": "MODULE"})
    """modules imported before the env is looked up, e.g. ones that register envs (the current directory is on sys.path, as with python -m)"""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """keyword arguments for the env constructor (JSON object); empty = the env's demo preset (registered with the env), if any"""
    env_url: str = ""
    """URL of a remote env server; empty runs the env in-process"""
    env_protocol: Literal["auto", "agentrl", "openenv"] = "auto"
    """protocol of the server at env_url: agentrl's own, OpenEnv's (its one env; --env is not used, env_kwargs go to its reset) or auto (asks the server)"""
    session_url: str = ""
    """URL of a session server; empty uses the in-process session manager"""
    agent: str = ""
    """a black-box agent command that plays each episode (run once per episode with OPENAI_BASE_URL, ANTHROPIC_BASE_URL, keys and AGENTRL_TASK set; see docs/session.md; with --session-url its sessions are on that server); with --agent-workers: the agent function, module:function or path/file.py:function; empty: agentrl's own agent loop"""
    agent_workers: int = 0
    """N >= 1: --agent is a function play(task, env) run by N worker processes started once per run, each playing episodes one after another (docs/session.md); 0: the agent command starts once per episode"""
    group_size: int = 8
    """G: episodes per task (a GRPO group)"""
    tasks_per_step: int = 8
    """tasks (groups) per train step; the batch is tasks_per_step * group_size episodes"""
    max_new_tokens: int = 32
    """token budget of one assistant turn"""
    max_turns: int | None = None
    """assistant turns per episode before it is truncated; unset = the env's own max_turns (fewer cuts episodes shorter, more is an error)"""
    temperature: float = 1.0
    """sampling temperature for training rollouts; the trainer scores the sampled tokens under softmax(logits / T) too (eval: greedy, and eval_samples at T)"""
    max_infra_retries: int = 2
    """retries of an episode that failed for infrastructure reasons, on a fresh env"""
    episode_timeout_s: float = 120.0
    """deadline for one episode; past it the episode counts as an infrastructure failure"""
    max_staleness: int = 0
    """asynchronous rollout: groups play continuously while the trainer updates, and no trained token is more than K policy versions old (0: synchronous, every step rolls out with the latest weights)"""
    overprovision: int = 0
    """asynchronous rollout: start this many groups beyond the staleness bound, so stragglers are carried over instead of delaying a batch (needs max_staleness >= 1)"""
    requeue_stale: bool = False
    """asynchronous rollout, strict on-policy: no episode spans a weight update; groups in flight when the weights change are aborted and replayed from their start (needs max_staleness >= 1; not with --engine sglang, which reports no per-token versions)"""
    stale_tokens: Literal["wait", "mask"] = "wait"
    """asynchronous rollout, a straggler whose first tokens reach K versions old: 'wait' (the trainer waits for it and trains it whole) or 'mask' (the trainer never waits; tokens more than K versions old when it is trained are left out of the loss, kept as context)"""
    eval_every: int = 5
    """evaluate on held-out seeds every N train steps (0: only at start and end)"""
    eval_episodes: int = 64
    """number of held-out seeds per evaluation"""
    eval_seed_offset: int = 1_000_000
    """held-out seeds start here; training seeds count up from 0 and never reach it"""
    eval_samples: int = 4
    """episodes sampled at --temperature per held-out seed, beside the greedy one, for pass@k (`agentrl eval`, `sft`, and train's evals at the start and end of RL; the evals every eval_every steps stay greedy); 0: greedy only"""
    eval_k: str = ""
    """the k of pass@k, comma-separated (e.g. '1,4'), each at most eval_samples; empty: 1 and eval_samples"""
    eval_success_threshold: float | None = None
    """an eval episode succeeds (eval/solved, pass@k) when its return is >= this; unset: the env's maximum return, reward_range[1]"""

    def __post_init__(self) -> None:
        for name in ("group_size", "tasks_per_step", "max_new_tokens", "eval_episodes"):
            if getattr(self, name) < 1:
                _fail("rollout", name, getattr(self, name), "must be >= 1")
        if self.max_turns is not None and self.max_turns < 1:
            _fail("rollout", "max_turns", self.max_turns, "must be >= 1 (or unset: the env's own max_turns)")
        if self.temperature < 0:
            _fail("rollout", "temperature", self.temperature, "must be >= 0")
        for name in ("max_infra_retries", "eval_every", "eval_samples", "max_staleness", "overprovision"):
            if getattr(self, name) < 0:
                _fail("rollout", name, getattr(self, name), "must be >= 0")
        if self.overprovision and not self.max_staleness:
            _fail(
                "rollout",
                "overprovision",
                self.overprovision,
                "needs asynchronous rollout: set --max-staleness 1 or more",
            )
        if self.requeue_stale and not self.max_staleness:
            _fail(
                "rollout",
                "requeue_stale",
                self.requeue_stale,
                "needs asynchronous rollout: set --max-staleness 1 or more",
            )
        if self.stale_tokens == "mask" and not self.max_staleness:
            _fail(
                "rollout",
                "stale_tokens",
                self.stale_tokens,
                "needs asynchronous rollout: set --max-staleness 1 or more",
            )
        if self.stale_tokens == "mask" and self.requeue_stale:
            _fail(
                "rollout",
                "stale_tokens",
                self.stale_tokens,
                "conflicts with --requeue-stale (which replays stale groups instead): pick one",
            )
        if not isinstance(self.env_kwargs, dict):
            _fail("rollout", "env_kwargs", self.env_kwargs, "must be a table / JSON object")
        from agentrl.trainer.evaluation import parse_ks

        parse_ks(self.eval_k, self.eval_samples)  # every k of pass@k within 1..eval_samples
        if self.eval_success_threshold is not None and not math.isfinite(self.eval_success_threshold):
            _fail("rollout", "eval_success_threshold", self.eval_success_threshold, "must be a finite number")
        if self.agent or self.agent_workers:
            from agentrl.trainer.agent_workers import check_agent

            check_agent(self.agent, self.agent_workers)  # a command that exists, or a function that loads


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
    """token budget of one forward/backward micro-batch: real tokens when packing, else rows x longest row"""
    packing: Literal["auto", "on", "off"] = "auto"
    """pack a micro-batch's rows into one padding-free sequence that attention cannot cross (docs/training.md); auto: wherever the model's attention can (sdpa, eager, flash)"""
    score_chunk_tokens: int = 1024
    """score logprobs this many positions at a time (LM head, softmax, entropy), so no micro-batch holds its full-vocabulary logits (0 = off)"""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """compute dtype of the update: bf16 (autocast; float32 weights, optimizer and logprobs), fp32; auto = bf16 on CUDA, fp32 on CPU"""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            _fail("optim", "lr", self.lr, "must be > 0")
        if min(self.grad_clip, self.weight_decay, self.warmup_steps, self.score_chunk_tokens) < 0:
            _fail("optim", "grad_clip/weight_decay/warmup_steps/score_chunk_tokens", (self.grad_clip,
                  self.weight_decay, self.warmup_steps, self.score_chunk_tokens), "must be >= 0")  # fmt: skip
        if self.micro_batch_tokens < 16:
            _fail("optim", "micro_batch_tokens", self.micro_batch_tokens, "must be >= 16")


@dataclass(frozen=True)
class RunConfig:
    """Length of the run, the supervised warm start, outputs and checkpoints."""

    steps: int = 30
    """RL train steps"""
    seed: int = 0
    """seed of torch, of every episode's sampling (0: the seeds earlier versions drew) and of a dataset's row order; env tasks are seeds step x tasks_per_step + i whatever it is"""
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
    save_rollouts: str = "auto"
    """episodes kept in RUN_DIR/rollouts (agentrl view reads them): all, none, sample:N (at most N a step, whole groups); auto = sample:1024"""
    weight_sync: SyncKind = "auto"
    """inprocess (copy tensors), disk (safetensors + reload), broadcast (torch.distributed), ipc (CUDA IPC into a colocated vLLM); auto = disk for an engine in another process, else inprocess"""
    tensorboard: bool = True
    """also write TensorBoard event files"""
    log: list[str] = field(default_factory=list, metadata={"metavar": "wandb|mlflow"})
    """also log metrics and a sampled rollout table to these trackers: wandb, mlflow (comma-separated or repeated; each needs its extra, docs/training.md "Where metrics go")"""
    wandb: bool = False
    """deprecated: the same as --log wandb (kept for old commands and config files)"""
    progress: bool = True
    """show a rich progress bar"""

    def __post_init__(self) -> None:
        for name in ("steps", "sft_steps", "checkpoint_every"):
            if getattr(self, name) < 0:
                _fail("run", name, getattr(self, name), "must be >= 0")
        if self.sft_batch_size < 1 or self.sft_lr <= 0:
            _fail("run", "sft_batch_size/sft_lr", (self.sft_batch_size, self.sft_lr), "must be > 0")
        if self.save_rollouts != "auto":
            from agentrl.rollouts.rows import parse_save_rule

            parse_save_rule(self.save_rollouts)
        object.__setattr__(self, "log", log_targets(self.log, wandb=self.wandb))  # "a,b" split, checked


@dataclass(frozen=True)
class TrainConfig:
    """The whole configuration of `agentrl train`, one table per section."""

    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", choose_engine(self))  # --engine auto: hf or a colocated vllm
        a, r = self.algo, self.rollout
        if a.algo == "grpo" and a.advantage_kind in ("grpo", "dr_grpo", "rloo") and r.group_size < 2:
            _fail("rollout", "group_size", r.group_size, f"{a.advantage_kind} needs a group of at least 2 episodes "
                  "per task")  # fmt: skip
        batch = r.tasks_per_step * r.group_size
        if batch % a.num_minibatches:
            _fail("algo", "num_minibatches", a.num_minibatches, f"the batch of tasks_per_step*group_size = "
                  f"{r.tasks_per_step}*{r.group_size} = {batch} episodes does not split evenly; pick a divisor")  # fmt: skip
        if a.max_refill_rounds and r.max_staleness:
            _fail("algo", "max_refill_rounds", a.max_refill_rounds, "the asynchronous rollout (max_staleness="
                  f"{r.max_staleness}) plays groups ahead and does not refill dropped ones; leave it unset "
                  "(dynamic sampling then trains on fewer groups) or use --max-staleness 0")  # fmt: skip
        if a.overlong_buffer >= r.max_new_tokens and a.overlong_buffer:
            _fail(
                "algo", "overlong_buffer", a.overlong_buffer, f"must be < max_new_tokens={r.max_new_tokens}"
            )
        remote_engine = r.session_url or self.model.engine != "hf" or self.cluster.ray
        if remote_engine and self.model.engine_max_batch != ENGINE_MAX_BATCH:
            _fail("model", "engine_max_batch", self.model.engine_max_batch, "sets the embedded engine of this "
                  "process only (--engine hf, no --session-url or --ray); a server's engine has its own batch "
                  "limit (`agentrl serve-engine --max-batch-size`)")  # fmt: skip
        if self.cluster.ray:
            check_ray(self)
        check_data(self)
        if r.requeue_stale and self.model.engine == "sglang":
            _fail("rollout", "requeue_stale", r.requeue_stale, "needs per-token weight versions to see an episode "
                  "that ran across an update, and SGLang reports none (its tokens carry the version at "
                  "submission, which keeps --stale-tokens mask's bound); use --stale-tokens mask, or the "
                  "default partial rollout, or --engine vllm")  # fmt: skip
        if r.session_url and self.model.engine != "hf":
            _fail("model", "engine", self.model.engine, f"with rollout.session_url={r.session_url!r} the session "
                  "server's own engine serves the episodes; start it with `agentrl serve-session --engine "
                  f"{self.model.engine}` and leave --engine out here")  # fmt: skip
        if self.run.weight_sync == "auto":
            object.__setattr__(
                self,
                "run",
                dataclasses.replace(self.run, weight_sync="disk" if remote_engine else "inprocess"),
            )
        if self.model.engine != "hf" and self.run.weight_sync == "inprocess":
            _fail("run", "weight_sync", self.run.weight_sync, f"the {self.model.engine} engine runs in another "
                  "process; use --weight-sync disk (it reloads the safetensors the trainer writes)")  # fmt: skip
        if r.session_url and self.run.weight_sync == "inprocess":
            _fail("run", "weight_sync", self.run.weight_sync, f"cannot reach the engine of rollout.session_url="
                  f"{r.session_url!r}, which runs in another process; use --weight-sync disk (the server loads "
                  "the safetensors the trainer writes: same machine or a shared file system) or --weight-sync "
                  "broadcast (torch.distributed)")  # fmt: skip
        check_lora(self)
        check_parallel(self)
        check_colocate(self)

    @property
    def batch_size(self) -> int:
        return self.rollout.tasks_per_step * self.rollout.group_size


SECTIONS: tuple[tuple[str, type], ...] = tuple((f.name, f.default_factory) for f in fields(TrainConfig))  # type: ignore[misc]


def field_help(cls: type) -> dict[str, str]:
    """The docstring under each field of ``cls`` (see :func:`agentrl.configlib.field_help`)."""
    return configlib.field_help(cls)


def load_toml(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a ``run.toml`` into ``{section: {key: value}}``, rejecting unknown tables and keys."""
    return configlib.load_toml(path, SECTIONS)


def add_cli_flags(parser: argparse.ArgumentParser, sections: tuple[str, ...] | None = None) -> None:
    """Add one flag per config field (``--group-size``), grouped by section, plus ``--config``.

    Flags default to "not given" so that :func:`resolve` can layer them over a TOML file.
    """
    configlib.add_cli_flags(parser, SECTIONS, sections)


def resolve(
    args: argparse.Namespace | None = None, *, toml: str | Path | None = None, **overrides: Any
) -> TrainConfig:
    """Defaults < the env's demo preset < TOML file < CLI flags < ``overrides`` (``section.key`` or bare keys).

    ``rollout.imports`` are imported and a ``module:Class`` / ``file.py:Class`` env is registered here
    (:func:`agentrl.envs.resolve_env`), so a missing file, a failed import or a missing class fails
    now, before any model loads; ``rollout.env`` keeps the reference as given (config.toml, resume).
    """
    values: dict[str, dict[str, Any]] = {sec: {} for sec, _ in SECTIONS}
    path = toml if toml is not None else getattr(args, "config", None) if args is not None else None
    if path:
        for sec, table in load_toml(path).items():
            values[sec].update(table)
    if args is not None:
        for sec, table in configlib.flag_values(args, SECTIONS).items():
            values[sec].update(table)
    owner = {f.name: sec for sec, cls in SECTIONS for f in fields(cls)}
    for key, v in overrides.items():
        sec, _, name = key.rpartition(".")
        if not sec:
            if key not in owner:
                raise configlib.unknown_key(key, sorted(owner), "overrides")
            sec, name = owner[key], key
        values[sec][name] = v
    apply_dataset(values)  # --dataset is the dataset env with the [data] section as its arguments
    _apply_preset(values, _find_env(values))
    return TrainConfig(**configlib.build_sections(SECTIONS, values))


def _find_env(values: dict[str, dict[str, Any]]) -> EnvSpec | None:
    """Import ``rollout.imports``, then the spec of ``rollout.env`` (a class reference is registered now).

    A bad import or class reference fails here, before any model loads. None when this process
    cannot know the env: an id it does not know (``make_env_factory`` names a local typo), or a
    class reference given with ``--env-url`` (the env server resolves it itself).
    """
    from agentrl.envs import spec
    from agentrl.envs.errors import UnknownEnvError
    from agentrl.envs.registry import import_modules, is_reference

    rollout = values["rollout"]
    imports = rollout.get("imports", [])
    if isinstance(imports, list) and all(isinstance(m, str) for m in imports):
        import_modules(imports)  # else build_sections reports the type error
    env = rollout.get("env", RolloutConfig.env)
    if rollout.get("env_url") and rollout.get("env_protocol") == "openenv":
        return None  # an OpenEnv server serves its own env: no preset of --env applies
    if not isinstance(env, str) or (is_reference(env) and rollout.get("env_url")):
        return None  # (a wrong type: build_sections reports it)
    try:
        return spec(env)  # countdown and countdown-v0 alike
    except UnknownEnvError:
        return None


def _apply_preset(values: dict[str, dict[str, Any]], found: EnvSpec | None) -> None:
    """Fill the keys the user left out from the env's registered ``demo_preset`` (only without env_kwargs).

    The preset is the difficulty and run length at which the default tiny model, from random
    weights, learns the task within the few-minute CPU demo; an explicit ``--env-kwargs``
    (any JSON object) turns the whole preset off. An env this process does not know (e.g.
    one served at ``--env-url`` only) has no preset.
    """
    if found is None or values["rollout"].get("env_kwargs"):
        return
    sections = dict(SECTIONS)
    for sec, table in found.demo_preset.items():
        if sec not in sections:
            raise configlib.unknown_key(sec, list(sections), f"the demo_preset of env {found.id!r}")
        known = [f.name for f in fields(sections[sec])]
        for key, v in table.items():
            if key not in known:
                raise configlib.unknown_key(key, known, f"the demo_preset of env {found.id!r} [{sec}]")
            values[sec].setdefault(key, copy.deepcopy(v))


def to_dict(cfg: TrainConfig) -> dict[str, dict[str, Any]]:
    return dataclasses.asdict(cfg)


def to_toml(cfg: TrainConfig) -> str:
    """Render the resolved config as TOML that :func:`load_toml` reads back to the same config."""
    return configlib.to_toml(to_dict(cfg))


def advisories(cfg: TrainConfig) -> list[str]:
    """Valid settings that probably do not do what was meant, each with what to change (printed at the start)."""
    a, out = cfg.algo, []
    if a.dynamic_sampling and cfg.rollout.max_staleness:
        out.append(
            "algo.dynamic_sampling with rollout.max_staleness > 0: the asynchronous rollout does not refill "
            "the dropped groups, so a step trains on fewer than tasks_per_step groups "
            "(rollout/groups_informative is not logged; algo/dynamic_sampling_kept shows the share kept)"
        )
    if cfg.rollout.eval_samples and cfg.rollout.temperature == 0:
        out.append(
            f"rollout.eval_samples={cfg.rollout.eval_samples} at temperature 0: the sampled eval episodes are the "
            "greedy one repeated, so pass@k equals greedy solved. Use --eval-samples 0 (greedy only)"
        )
    if a.decoupled and a.epochs * a.num_minibatches == 1:
        out.append(
            "algo.decoupled=True with one update a step (epochs=1, num_minibatches=1): the clip is "
            "against the weights of that same update, so it never acts and the update is an "
            "importance-weighted policy gradient with no trust region (at --max-staleness 1 on "
            "countdown it learned markedly slower than plain PPO; docs/training.md). "
            "Use --num-minibatches 2 or more, as decoupled PPO is meant to run"
        )
    return out
