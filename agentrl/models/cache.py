"""The model cache: building catalogue entries atomically and refusing half-written ones.

Layout: ``$AGENTRL_HOME/models/<name>/`` (``AGENTRL_HOME`` defaults to ``~/.cache/agentrl``).
A build writes every file into a temporary directory next to the target, writes
``agentrl_manifest.json`` (sizes and SHA-256 of every file, the recipe version) last, and then
renames the directory into place, so a reader sees either no entry or a complete one. A
per-entry ``fcntl`` lock serialises concurrent builders; the second one finds the entry
complete and reuses it. An entry whose manifest is missing, whose files are missing or whose
hashes differ is reported with a warning and rebuilt, never loaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from agentrl.models.errors import ModelError
from agentrl.models.registry import BUILDER_VERSION, MODELS, ModelSpec

__all__ = [
    "MANIFEST",
    "METADATA",
    "build",
    "cache_dir",
    "check_entry",
    "ensure_built",
    "models_home",
    "unknown_model_error",
]

log = logging.getLogger(__name__)

MANIFEST = "agentrl_manifest.json"
"""Written last into a built directory: file sizes and hashes; its presence marks a complete build."""
METADATA = "agentrl_model.json"
"""Name, family, seed and format source of a built model."""

Progress = Callable[[str], None]
"""Receives a short description of each build stage."""


def models_home() -> Path:
    """``$AGENTRL_HOME/models`` (``~/.cache/agentrl/models`` by default)."""
    home = os.environ.get("AGENTRL_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "agentrl")
    return Path(home) / "models"


def cache_dir(name: str) -> Path:
    """Where the catalogue entry ``name`` lives in the cache."""
    return models_home() / name


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_verified: dict[tuple[Path, str], tuple[tuple[str, int, int], ...]] = {}
"""Directories whose hashes were checked in this process, with the file stats they had then."""


def _stats(path: Path) -> tuple[tuple[str, int, int], ...]:
    return tuple(
        sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in path.iterdir() if f.is_file())
    )


def check_entry(path: Path, name: str) -> str | None:
    """``None`` when ``path`` holds a complete, intact build of ``name``; otherwise what is wrong.

    Hashes are checked once per process; later calls re-hash only when a file's size or mtime changed.
    """
    try:
        if _verified.get((path, name)) == _stats(path):
            return None
    except OSError:
        pass
    problem = _check_entry(path, name)
    if problem is None:
        with contextlib.suppress(OSError):
            _verified[(path, name)] = _stats(path)
    else:
        _verified.pop((path, name), None)
    return problem


def _check_entry(path: Path, name: str) -> str | None:
    manifest_path = path / MANIFEST
    if not path.is_dir() or not any(path.iterdir()):
        return "missing"
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        return f"no {MANIFEST} (an interrupted or foreign build)"
    except (OSError, ValueError) as e:
        return f"unreadable {MANIFEST}: {e}"
    if manifest.get("name") != name:
        return f"it holds {manifest.get('name')!r}, not {name!r}"
    if manifest.get("builder_version") != BUILDER_VERSION:
        return f"built by recipe version {manifest.get('builder_version')}, current is {BUILDER_VERSION}"
    for fname, info in manifest.get("files", {}).items():
        f = path / fname
        if not f.is_file():
            return f"file {fname} is missing"
        if f.stat().st_size != info["size"]:
            return f"file {fname} has {f.stat().st_size} bytes, the manifest says {info['size']}"
        if _sha256(f) != info["sha256"]:
            return f"file {fname} does not match its hash in the manifest"
    return None


@contextlib.contextmanager
def _locked(target: Path) -> Iterator[None]:
    lock_path = target.parent / f".{target.name}.lock"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fh = lock_path.open("a")
    except OSError as e:
        raise ModelError(
            f"cannot create the model cache lock {lock_path}: {e}; set AGENTRL_HOME (or --out) to a writable directory"
        ) from e
    with fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _write_entry(spec: ModelSpec, out: Path, progress: Progress) -> None:
    """Write every file of ``spec`` into the (empty) directory ``out``."""
    from agentrl.models.vocab import build_tokenizer, write_tokenizer_files
    from agentrl.models.weights import write_model_files

    progress("converting Qwen's vocabulary" if spec.vocab == "qwen" else "training the BPE tokenizer")
    tok = build_tokenizer(spec)
    write_tokenizer_files(tok, spec, out)

    def tid(token: str) -> int:
        idx = tok.token_to_id(token)
        if idx is None:
            raise ModelError(f"building {spec.name!r}: token {token!r} is not in the tokenizer")
        return idx

    progress("writing the model weights")
    n_tokens = tok.get_vocab_size(with_added_tokens=True)
    vocab_size = 151_936 if spec.vocab == "qwen" else -(-n_tokens // 64) * 64
    params = write_model_files(
        spec,
        out,
        vocab_size=vocab_size,
        bos_id=tid(spec.bos) if spec.bos else None,
        eos_id=tid(spec.eos),
        pad_id=tid(spec.pad),
        stop_ids=[tid(t) for t in spec.stop],
    )
    meta = {
        "name": spec.name,
        "family": spec.family,
        "seed": spec.seed,
        "format_source": spec.format_source,
        "vocab": spec.vocab,
        "arch": spec.arch,
        "parameters": params,
        "tokenizer_size": n_tokens,
    }
    (out / METADATA).write_text(json.dumps(meta, indent=2) + "\n")
    progress("writing the manifest")
    files = {
        p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(out.iterdir()) if p.is_file()
    }
    manifest = {"name": spec.name, "builder_version": BUILDER_VERSION, "files": files}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _replaceable(target: Path) -> bool:
    """A directory a build may replace: empty, inside the cache, or an earlier (possibly damaged) build."""
    if target.parent == models_home().absolute():
        return True
    return not any(target.iterdir()) or (target / MANIFEST).exists() or (target / METADATA).exists()


def build(name: str, out: Path | None = None, force: bool = False, progress: Progress | None = None) -> Path:
    """Build catalogue entry ``name`` into ``out`` (default: the cache) and return the directory.

    An intact existing build is reused unless ``force``; a damaged one is rebuilt with a warning.
    """
    spec = MODELS.get(name)
    if spec is None:
        raise unknown_model_error(name)
    target = Path(out) if out is not None else cache_dir(name)
    target = target.expanduser().absolute()
    report = progress or (lambda _msg: None)
    with _locked(target):
        problem = check_entry(target, name)
        if problem is None and not force:
            return target
        if target.exists() and not target.is_dir():
            raise ModelError(f"cannot build model {name!r} into {target}: it is a file, not a directory")
        if target.is_dir() and not _replaceable(target):
            raise ModelError(
                f"cannot build model {name!r} into {target}: the directory holds files that are not an agentrl "
                "model build; pass an empty or new directory to --out"
            )
        if problem is not None and problem != "missing":
            if problem.startswith("built by recipe version"):
                log.info("rebuilding model %r at %s: %s", name, target, problem)
            else:
                warnings.warn(
                    f"model {name!r} at {target} is damaged ({problem}); rebuilding it", stacklevel=3
                )
        started = time.perf_counter()
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        except OSError as e:
            raise ModelError(
                f"cannot write model {name!r} under {target.parent}: {e}; "
                "set AGENTRL_HOME (or --out) to a writable directory"
            ) from e
        try:
            _write_entry(spec, tmp, report)
            tmp.chmod(0o755)
            for f in tmp.iterdir():
                f.chmod(0o644)
            if target.exists():
                trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
                os.replace(target, trash / "entry")
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("built model %r into %s in %.1f s", name, target, time.perf_counter() - started)
    return target


def ensure_built(name: str) -> Path:
    """The cache directory of ``name``, building (or repairing) it first when needed."""
    target = cache_dir(name)
    if check_entry(target, name) is None:
        return target
    return build(name)


def unknown_model_error(name: str) -> ModelError:
    """A :class:`ModelError` naming the closest known model and listing all of them."""
    import difflib

    known = list(MODELS)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ModelError(
        f"unknown model {name!r}; {hint}known offline models: {', '.join(known)} "
        "(or pass a hub id like 'Qwen/Qwen3-0.6B' or a local model directory; 'agentrl models list' shows all)"
    )
