"""Trainer ranks as Ray actors: ``agentrl train --ray --trainers N --engines E``.

::

    summary = train_on_ray(cfg)     # the driver: placement, N rank actors, waits, cleans up

One placement group holds ``N`` trainer bundles (``--trainer-cpus``/``--trainer-gpus`` each)
followed by ``E`` engine bundles. Trainer rank ``r`` is the actor ``agentrl-trainer-<r>`` in
bundle ``r`` (the rank layout is the bundle order, not whatever order Ray starts them in);
engine replica ``j`` is the actor ``agentrl-engine-<j>`` in bundle ``N + j``, owned by rank
``j mod N``: each rank rolls out its share of the step's tasks on its own ``E / N`` replicas
(:class:`agentrl.cluster.engines.RayEngines`, with its own supervisor) and the ranks train
data-parallel over a ``torch.distributed`` group (gloo on CPU, NCCL when the ranks have GPUs)
exactly as under ``torchrun`` (:mod:`agentrl.trainer.distributed`). Rank 0 writes each update's
checkpoint once; every rank's replicas reload it (``--weight-sync disk``), so the run directory
must be on a file system every node shares (one machine, or a shared mount). Each rank writes
its process id to ``RUN_DIR/ranks/rank-<r>.pid`` before it starts training.

Faults: the driver waits on the ranks and checks them every ``poll_s``. A rank that raises ends
the run with its error; a rank whose actor dies (``kill -9``, a lost node) ends it with a
:class:`ClusterError` naming the rank. The other ranks are stopped at once (a data-parallel
group cannot continue without one of its members, and its collectives would only time out),
so no checkpoint is written after the failure; ``--resume RUN_DIR/checkpoints/step-N``
continues from the last one written (``--checkpoint-every``). Whatever ends the run — success,
error, Ctrl-C — the actors (and the engine replicas they own, and those replicas' servers) are
killed, the placement group removed, and a Ray this started shut down.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agentrl.cluster.engines import Placement
from agentrl.cluster.parts import Share, bundles
from agentrl.cluster.placement import NAMESPACE, ClusterError, connect, get_within, node_address, reserve
from agentrl.errors import AgentRLError

__all__ = ["TrainerActor", "train_on_ray"]

log = logging.getLogger(__name__)

_PASSED_ENV = ("AGENTRL_", "HF_", "TRANSFORMERS_", "OMP_NUM_THREADS")


@ray.remote(max_restarts=0)
class TrainerActor:
    """One data-parallel trainer rank: joins the group at ``master`` and runs the training loop."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def address(self) -> tuple[str, int]:
        """This node's address and a free port on it (rank 0's is the group's rendezvous)."""
        from agentrl.engines.launcher import free_port

        return node_address(), free_port()

    def process(self) -> tuple[str, int]:
        """This rank's machine (its boot id) and process id: the driver waits for it to exit."""
        return _boot_id(), os.getpid()

    def train(self, cfg: Any, world: int, master: tuple[str, int], share: Share, cwd: str,
              env: dict[str, str], cpus: float) -> dict[str, Any]:  # fmt: skip
        import functools

        import torch

        from agentrl.cluster.parts import start_parts
        from agentrl.trainer.loop import train

        os.environ.update(env)
        os.environ.update(
            RANK=str(self.rank), WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
            MASTER_ADDR=master[0], MASTER_PORT=str(master[1]),
        )  # fmt: skip
        if Path(cwd).is_dir():  # relative paths in the config (an env file, a resume dir) mean the driver's
            os.chdir(cwd)
        torch.set_num_threads(max(1, int(cpus)))
        _write_pid(Path(cfg.run.run_dir), self.rank)
        return dataclasses.asdict(train(cfg, start_parts=functools.partial(start_parts, share=share)))


def _boot_id() -> str:
    """This machine's boot id: two processes share it exactly when they share a kernel."""
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return ""


def _exited(pid: int) -> bool:
    """Whether process ``pid`` (on this machine) has exited: gone, or a zombie left to reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def _write_pid(run_dir: Path, rank: int) -> None:
    """``RUN_DIR/ranks/rank-<r>.pid``: this rank's process id (on its node), to attach a debugger to."""
    (run_dir / "ranks").mkdir(parents=True, exist_ok=True)
    (run_dir / "ranks" / f"rank-{rank}.pid").write_text(f"{os.getpid()}\n")


def _shares(trainers: int, engines: int, envs: int, pg: Any) -> list[Share]:
    """Rank ``r`` owns engine replicas ``j ≡ r (mod trainers)``, in bundles ``trainers + j``, and env
    servers ``k ≡ r (mod trainers)``, in bundles ``trainers + engines + k``."""

    def own(n: int, first: int, r: int) -> Placement:
        ks = [k for k in range(n) if k % trainers == r]
        return Placement(pg, [first + k for k in ks], ks)

    return [
        Share(own(engines, trainers, r), own(envs, trainers + engines, r) if envs else None)
        for r in range(trainers)
    ]


def train_on_ray(cfg: Any, *, poll_s: float = 2.0, start_timeout_s: float = 120.0) -> dict[str, Any]:
    """Run ``cfg`` with ``cluster.trainers`` rank actors; rank 0's run summary (``RunSummary`` fields)."""
    from agentrl.trainer.runtime import resolve_run_dir

    c = cfg.cluster
    n, e = c.trainers, c.engines
    run_dir = resolve_run_dir(cfg).absolute()  # one directory for every rank, wherever its actor started
    cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, run_dir=str(run_dir)))
    started = connect(c.ray_address, log_to_driver=True)  # rank 0 prints the run's progress here
    pg: Any = None
    actors: list[Any] = []
    try:
        trainer = {"CPU": c.trainer_cpus, **({"GPU": c.trainer_gpus} if c.trainer_gpus else {})}
        engine, env_server = bundles(cfg)
        pg = reserve(
            [trainer] * n + [engine] * e + [env_server] * c.env_servers,
            f"{n} trainer ranks, {e} {cfg.model.engine} engine replicas and {c.env_servers} env servers",
            c.placement_timeout_s,
        )
        for r in range(n):
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=r)
            actors.append(
                TrainerActor.options(  # type: ignore[attr-defined]
                    name=f"agentrl-trainer-{r}", namespace=NAMESPACE, num_cpus=c.trainer_cpus,
                    num_gpus=c.trainer_gpus, scheduling_strategy=strategy,
                ).remote(r)
            )  # fmt: skip
        master = get_within(actors[0].address.remote(), start_timeout_s, "starting trainer rank 0")
        procs = get_within(
            [a.process.remote() for a in actors], start_timeout_s, "starting the trainer ranks"
        )
        env = {k: v for k, v in os.environ.items() if k.startswith(_PASSED_ENV)}
        # rank 0's console is printed here behind Ray's "(TrainerActor pid=N)" prefix: as wide as this one
        env["COLUMNS"] = str(max(80, shutil.get_terminal_size((200, 24)).columns - 28))
        places = _shares(n, e, c.env_servers, pg)
        refs = [
            a.train.remote(cfg, n, master, places[r], os.getcwd(), env, c.trainer_cpus)
            for r, a in enumerate(actors)
        ]
        return _wait(refs, poll_s, run_dir, lambda: _stop(actors, refs, procs))[0]
    finally:
        _stop(actors, [])
        if pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
        if started and ray.is_initialized():
            ray.shutdown()


def _stop(
    actors: list[Any], refs: list[Any], procs: Sequence[tuple[str, int]] = (), timeout_s: float = 30.0
) -> None:  # fmt: skip
    """Kill every rank actor (its engine actors die with their owner, their servers too).

    With ``refs``, wait up to ``timeout_s`` for their tasks to end and for the rank processes on
    this machine (``procs``: boot id and pid of each) to exit, so that no rank still writes a
    checkpoint once this returns: Ray reports a killed actor's task ended before its process has
    gone. A rank on another machine is only waited for through its task."""
    for a in actors:
        with contextlib.suppress(Exception):
            ray.kill(a, no_restart=True)
    if not refs:
        return
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(Exception):
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    here = _boot_id()
    local = [pid for boot, pid in procs if boot and boot == here]
    while local and time.monotonic() < deadline:
        local = [pid for pid in local if not _exited(pid)]
        if local:
            time.sleep(0.05)


def _resume_hint(run_dir: Path) -> str:
    """How to continue after a rank died: the last checkpoint written, if any."""
    steps = sorted(  # complete ones only: trainer_state.pt is renamed into place last
        (p for p in (run_dir / "checkpoints").glob("step-*") if (p / "trainer_state.pt").exists()),
        key=lambda p: int(p.name[5:]) if p.name[5:].isdigit() else -1,
    )
    if not steps:
        return "no checkpoint was written yet (save them with --checkpoint-every N)"
    return f"continue with --resume {steps[-1]}"


def _wait(refs: list[Any], poll_s: float, run_dir: Path, stop: Callable[[], None]) -> list[Any]:
    """Every rank's result; the first rank to fail ends the wait with its error, naming the rank.

    When a rank's actor died, ``stop`` ends the others before the resume hint is read: a rank that
    was still writing a checkpoint would otherwise finish it after the hint named the one before."""
    rank_of = {ref: r for r, ref in enumerate(refs)}
    results: dict[int, Any] = {}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=poll_s)
        for ref in done:
            r = rank_of[ref]
            try:
                results[r] = ray.get(ref, timeout=60)
            except ray.exceptions.RayTaskError as err:  # the rank raised: its own error, named
                cause = err.cause if isinstance(err.cause, BaseException) else err
                if isinstance(cause, KeyboardInterrupt):
                    raise KeyboardInterrupt from None
                if isinstance(cause, AgentRLError):
                    raise ClusterError(f"trainer rank {r}: {cause}") from None
                raise ClusterError(f"trainer rank {r} failed: {type(cause).__name__}: {cause}") from None
            except ray.exceptions.RayError as err:  # its actor died: killed, out of memory, node lost
                why = str(err).splitlines()[0].rstrip(".") if str(err) else ""
                stop()
                raise ClusterError(
                    f"trainer rank {r} (actor agentrl-trainer-{r}) died: {type(err).__name__}: {why}. "
                    f"The other ranks were stopped; {_resume_hint(run_dir)}"
                ) from None
    return [results[r] for r in range(len(refs))]
