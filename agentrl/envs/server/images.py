"""Per-env images: ``agentrl env build NAME``, a Docker image that serves one env, built offline.

The image is the local sandbox base image (``agentrl-sandbox``, built from the host's own Python by
``sandbox/build-image.sh``: nothing is pulled) with the env's Python dependencies added, and its
entry point is ``agentrl serve-env --env NAME --protocol both``: the container answers agentrl's
protocol and OpenEnv's on port 8000, so ``openenv validate --url``, OpenEnv's ``EnvClient``,
``RemoteEnv`` and ``agentrl train --env-url`` all drive it.

The dependencies are found, not declared: a subprocess of this interpreter imports what
``serve-env`` runs (the CLI, the env server with both protocols, uvicorn's event loop, HTTP and
WebSocket layers) and builds the env once; every module it loaded from outside the standard
library is copied by its top-level package (with the package's ``.libs`` folder of bundled shared
libraries and its ``.dist-info``, which keeps entry-point plugins registering). An env named by a
file (``path/to/env.py:Class``) has that file copied and served from the image. The base image's
Python must be the same minor version as this one (compiled extensions are per version); the build
checks it.

Limits: a module the env imports only later (inside a step, say) is not seen by the probe; import
it at module level, or pass ``--import MODULE``. Data files an env opens at run time from outside
its package are not copied. The image runs as ``nobody`` (uid 65534) with the base's read-only
stdlib; it needs no network beyond its own port.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.envs.errors import EnvError
from agentrl.sandbox.docker_backend import DEFAULT_IMAGE

__all__ = ["BASE_IMAGE", "ImageBuildError", "build_env_image", "dependency_roots", "image_tag"]

BASE_IMAGE = DEFAULT_IMAGE
"""The local image env images are built on (``sandbox/build-image.sh`` builds it offline)."""
PORT = 8000
SITE = "/opt/agentrl/site"
BUILD_TIMEOUT_S = 600.0

# What `serve-env --protocol both` imports while it runs, beyond what building the app imports.
_SERVED_MODULES = (
    "agentrl.cli",
    "agentrl.envs.server",
    "agentrl.envs.server.openenv",
    "uvicorn",
    "uvicorn.main",
    "uvicorn.lifespan.on",
    "uvicorn.loops.auto",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.protocols.websockets.websockets_impl",
    "uvicorn.protocols.websockets.websockets_sansio_impl",
)
_OPTIONAL_MODULES = ("uvloop", "httptools", "uvicorn.loops.uvloop", "uvicorn.protocols.http.httptools_impl")

_PROBE = r"""
import importlib, importlib.metadata, json, sys, sysconfig
served, optional, imports, env = json.loads(sys.argv[1])
for m in served:
    importlib.import_module(m)
for m in optional:
    try:
        importlib.import_module(m)
    except ImportError:
        pass
from agentrl.envs import import_modules, make, resolve_env
import_modules(imports)
env_id = resolve_env(env)
make(env_id).close()
from starlette.testclient import TestClient
from agentrl.envs.server import create_app
from agentrl.envs.server.config import ServerConfig
with TestClient(create_app(ServerConfig(env_ids=[env_id], protocol="both"))) as c:  # what serving loads late
    for path in ("/openapi.json", "/health", "/schema", "/metadata"):
        c.get(path)
    c.post("/reset", json={"seed": 0})
    with c.websocket_connect("/ws") as ws:
        ws.send_text('{"type": "reset", "data": {"seed": 0}}')
        ws.receive_text()
base = {k: sys.base_prefix for k in ("base", "platbase", "installed_base", "installed_platbase")}
stdlib = {sysconfig.get_path(k, vars=base) for k in ("stdlib", "platstdlib")}
def is_std(f):
    return any(f.startswith(p + "/") for p in stdlib) and "-packages/" not in f
files = {}
for name, mod in list(sys.modules.items()):
    if "." in name or name.startswith(("__editable__", "_distutils_hack")):
        continue
    f = getattr(mod, "__file__", None)
    if f is None and hasattr(mod, "__path__"):  # a namespace package: every folder of it
        dirs = [d for d in mod.__path__ if not is_std(d + "/")]
        if dirs:
            files[name] = dirs
    elif f and not is_std(f):
        files[name] = f
dists = {}
for top, names in importlib.metadata.packages_distributions().items():
    if top in files:
        for d in names:
            dist = importlib.metadata.distribution(d)
            path = getattr(dist, "_path", None)
            if path is not None:
                dists[top] = dists.get(top, []) + [str(path)]
print(json.dumps({"env_id": env_id, "files": files, "dists": dists,
                  "version": "%d.%d" % sys.version_info[:2]}))
"""


class ImageBuildError(EnvError):
    """An env image could not be built: no engine, no base image, a failed probe or build step."""


def image_tag(env_id: str) -> str:
    """The default tag of an env's image: ``agentrl-env-<name>:v<version>`` (a reference's class name)."""
    base = env_id.split(":")[-1].lower()
    return "agentrl-env-" + re.sub(r"[^a-z0-9_.-]+", "-", base).strip("-.") + ":latest"


def dependency_roots(env: str, imports: list[str], timeout: float = 120.0) -> dict[str, Any]:
    """Run the import probe in a subprocess: the env's id, every non-stdlib top-level module's file, their dist-infos."""
    arg = json.dumps([list(_SERVED_MODULES), list(_OPTIONAL_MODULES), imports, env])
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE, arg],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=Path.cwd(),
        )
    except subprocess.TimeoutExpired:
        raise ImageBuildError(
            f"importing env {env!r} to find its dependencies took over {timeout:g} s"
        ) from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ImageBuildError(f"cannot build env {env!r} to find its dependencies: {last}")
    probe: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return probe


def _context(probe: dict[str, Any], env_ref: str) -> tuple[bytes, str]:
    """The build context (a tar: Dockerfile + site folder) and the env reference served inside the image."""
    buf = io.BytesIO()
    added: set[str] = set()
    served = env_ref
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def add(path: Path, arc: str) -> None:
            if arc in added or not path.exists():
                return
            added.add(arc)
            tar.add(str(path), arcname=arc, filter=_clean)

        for name, file in sorted(probe["files"].items()):
            if isinstance(file, list):  # a namespace package: its folders merged
                for d in map(Path, file):
                    for child in sorted(d.iterdir()):
                        add(child, f"site/{name}/{child.name}")
                continue
            f = Path(file)
            root = f.parent if f.name == "__init__.py" else f
            add(root, f"site/{root.name}")
            add(root.parent / f"{name}.libs", f"site/{name}.libs")
            for dist in probe["dists"].get(name, []):
                add(Path(dist), f"site/{Path(dist).name}")
        rootfs = tarfile.TarInfo("rootfs")
        rootfs.type, rootfs.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(rootfs)
        for lib in _shared_libraries(_roots(probe)):  # the file a link points at, under the link's name
            info = tar.gettarinfo(str(lib.resolve()), arcname=f"rootfs{lib}")
            with open(lib.resolve(), "rb") as fh:
                tar.addfile(_clean(info) or info, fh)
        if ":" in env_ref and env_ref.split(":")[0].endswith(".py"):
            path, cls = env_ref.rsplit(":", 1)
            add(Path(path).resolve(), f"site/_agentrl_env/{Path(path).name}")
            served = f"{SITE}/_agentrl_env/{Path(path).name}:{cls}"
        dockerfile = _dockerfile(served, probe["env_id"]).encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    return buf.getvalue(), served


def _roots(probe: dict[str, Any]) -> list[Path]:
    roots = []
    for name, file in probe["files"].items():
        if isinstance(file, list):
            roots += [Path(d) for d in file]
            continue
        f = Path(file)
        roots.append(f.parent if f.name == "__init__.py" else f)
        roots.append(
            f.parent.parent / f"{name}.libs" if f.name == "__init__.py" else f.parent / f"{name}.libs"
        )
    return [r for r in roots if r.exists()]


def _shared_libraries(roots: list[Path]) -> list[Path]:
    """The system libraries the compiled extensions under ``roots`` link (``ldd``), e.g. libgcc_s.

    The base image holds only what the interpreter and its stdlib link; a wheel's own bundled
    libraries (``numpy.libs``) are copied with their package, so only paths outside ``roots`` count.
    """
    sos = [str(p) for r in roots for p in ([r] if r.is_file() else r.rglob("*.so*")) if ".so" in p.name]
    found: set[Path] = set()
    for i in range(0, len(sos), 64):
        out = subprocess.run(["ldd", *sos[i : i + 64]], capture_output=True, text=True, timeout=60)
        for m in re.finditer(r"=> (/\S+) \(", out.stdout):
            lib = Path(m.group(1))
            if not any(lib.is_relative_to(r) for r in roots if r.is_dir()):
                found.add(lib)
    return sorted(found)


def _clean(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    if "__pycache__" in info.name or info.name.endswith((".pyc", ".pyo")):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = (info.mode | 0o444) & ~0o222  # readable by the image's user, writable by none
    if info.isdir():
        info.mode |= 0o111
    return info


def _dockerfile(served: str, env_id: str) -> str:
    entry = [
        "python3",
        "-m",
        "agentrl.cli",
        "serve-env",
        "--env",
        served,
        "--protocol",
        "both",
        "--host",
        "0.0.0.0",
    ]
    return "\n".join(
        [
            f"FROM {BASE_IMAGE}",
            f"COPY site {SITE}",
            "COPY rootfs/ /",
            f"ENV PYTHONPATH={SITE} PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1",
            f"LABEL agentrl.env={json.dumps(env_id)}",
            "WORKDIR /work",
            "USER 65534:65534",
            f"EXPOSE {PORT}",
            f"ENTRYPOINT {json.dumps(entry)}",
            f'CMD ["--port", "{PORT}"]',
            "",
        ]
    )


def build_env_image(
    env: str,
    *,
    tag: str | None = None,
    imports: list[str] | None = None,
    client: Any = None,
    log: Callable[[str], None] = print,
) -> str:
    """Build the image serving ``env`` (an id or a ``module:Class`` / ``file.py:Class`` reference); its tag."""
    try:
        import docker
        from docker.errors import APIError, DockerException, ImageNotFound
    except ImportError:
        raise ImageBuildError("building images needs the docker SDK: pip install 'agentrl[docker]'") from None
    try:
        client = client or docker.from_env(timeout=int(BUILD_TIMEOUT_S))
        base = client.images.get(BASE_IMAGE)
    except ImageNotFound:
        raise ImageBuildError(
            f"the base image {BASE_IMAGE!r} is not built; build it offline with sandbox/build-image.sh"
        ) from None
    except DockerException as e:
        raise ImageBuildError(f"no Docker engine answers ({e}); start one, or set DOCKER_HOST") from None
    probe = dependency_roots(env, list(imports or []))
    base_py = _base_python(client)
    if base_py != probe["version"]:
        raise ImageBuildError(
            f"the base image {BASE_IMAGE!r} runs Python {base_py} but this is Python {probe['version']}; "
            "compiled dependencies would not load there: build from a Python of the same minor version"
        )
    tag = tag or image_tag(probe["env_id"])
    context, served = _context(probe, env)
    log(f"building {tag} on {BASE_IMAGE} ({base.short_id}): env {probe['env_id']}, "
        f"{len(probe['files'])} packages, {len(context) / 2**20:.0f} MiB context")  # fmt: skip
    try:
        for chunk in client.api.build(
            fileobj=io.BytesIO(context), custom_context=True, tag=tag, rm=True, forcerm=True,
            pull=False, decode=True, timeout=int(BUILD_TIMEOUT_S),
        ):  # fmt: skip
            if "error" in chunk:
                raise ImageBuildError(f"building {tag} failed: {chunk['error'].strip()}")
    except APIError as e:
        raise ImageBuildError(f"building {tag} failed: {e.explanation or e}") from None
    log(f"built {tag}: docker run --rm -p {PORT}:{PORT} {tag}  (serves {served} on both protocols)")
    return tag


def _base_python(client: Any) -> str:
    out = client.containers.run(
        BASE_IMAGE,
        ["python3", "-I", "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        remove=True,
        network_mode="none",
        stdout=True,
        stderr=True,
    )
    return str(out.decode().strip())
