"""The checked-in cluster manifests (docs/cluster/): the KubeRay RayJob and the Slurm script parse,
and the ``agentrl train`` each runs parses with agentrl's own CLI and resolves to a valid config.

Nothing is started: this catches the cheap mistakes that make a copied manifest fail at once (a
renamed flag, a value the config refuses, a syntax error in the script), as tests/test_readme.py
does for the README's commands.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import yaml

from agentrl.cli import build_parser
from agentrl.trainer.config import resolve

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cluster"


def _resolves(words: list[str]) -> None:
    assert words[:2] == ["agentrl", "train"], words
    cfg = resolve(build_parser().parse_args(words[1:]))  # a ConfigError names the field if the flags clash
    assert cfg.cluster.ray and cfg.cluster.ray_address == "auto", words  # joins the cluster started for it
    assert cfg.cluster.engines >= 1 and cfg.run.run_dir, words


def test_the_rayjob_manifest_is_a_rayjob_whose_entrypoint_resolves() -> None:
    doc = yaml.safe_load((DOCS / "rayjob.yaml").read_text())
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob"
    spec = doc["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    assert cluster["headGroupSpec"]["template"]["spec"]["containers"]
    assert cluster["workerGroupSpecs"] and all(g["replicas"] >= 1 for g in cluster["workerGroupSpecs"])
    words = shlex.split(spec["entrypoint"])
    _resolves(words)
    run_dir = Path(words[words.index("--run-dir") + 1])
    for pod in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:  # every pod sees the run dir
        (container,) = pod["template"]["spec"]["containers"]
        assert container["resources"]["requests"] and container["resources"]["limits"]
        mounts = [Path(m["mountPath"]) for m in container["volumeMounts"]]
        assert any(m in run_dir.parents for m in mounts), (mounts, run_dir)


def test_the_slurm_script_is_valid_bash_whose_agentrl_line_resolves() -> None:
    script = DOCS / "slurm.sbatch"
    check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    text = script.read_text()
    assert "trap cleanup EXIT" in text and "ray stop" in text and "ray start --head" in text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("agentrl train")]
    words = [w if w != "$RUN_DIR" else "/shared/run" for w in shlex.split(line.replace('"', ""))]
    _resolves(words)
