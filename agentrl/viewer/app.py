"""The trajectory viewer's web app: a JSON API over run directories and the page that draws it.

Endpoints (JSON; every bad input is a 4xx ``{"error": message}``)::

    GET /                                    the page (agentrl/viewer/static/)
    GET /api/runs                            [{index, name, path, episodes, steps, envs, warnings, has_store}]
    GET /api/version                         {"version"}: changes whenever a run writes a step file or a metric
    GET /api/runs/{i}/metrics                {"rows": metrics.jsonl's rows, "warnings"}
    GET /api/runs/{i}/episodes?FILTERS       {"total", "offset", "limit", "episodes"} (episode columns, no tokens)
    GET /api/runs/{i}/episode?key=K          every column of one episode, per-token lists included
    GET /api/runs/{i}/group?kind=&step=&group_id=   {"episodes"}: the group's G episodes by episode_index
    GET /api/runs/{i}/task/{task_id}         {"episodes"}: the task's episodes at every step, by step

``FILTERS`` are :data:`agentrl.viewer.query.FILTERS`. The episode table is read with the episode
columns only and cached per file (:mod:`agentrl.viewer.runs`), so the page's polling of
``/api/version`` every two seconds and its re-reads cost only what a live run wrote since.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentrl.httpkit import validation_message
from agentrl.viewer.errors import BadQueryError, NotFoundError, ViewerError
from agentrl.viewer.query import filter_table, final_answer, page, parse_int
from agentrl.viewer.runs import Run, check_run_dir, json_safe

__all__ = ["STATIC_DIR", "make_app"]

STATIC_DIR = Path(__file__).parent / "static"
router = APIRouter()


def make_app(run_dirs: Sequence[str | Path]) -> FastAPI:
    """The viewer over ``run_dirs`` (each a run directory; raises :class:`ViewerError` naming one that is not)."""
    if not run_dirs:
        raise ViewerError("no run directory given; pass one or more, e.g. runs/<name>")
    runs = [Run(check_run_dir(d), i) for i, d in enumerate(run_dirs)]
    app = FastAPI(title="agentrl viewer", docs_url=None, redoc_url=None)
    app.state.runs = runs
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    _install_error_handlers(app)
    return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ViewerError)
    async def _viewer(_: Request, exc: ViewerError) -> JSONResponse:
        return _error(exc.status, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, validation_message(exc.errors())[0])

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:  # a bug: still JSON, so the page can say it
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return _error(404, f"no such page or endpoint {request.url.path!r}; the API is under /api/runs")
        return _error(exc.status_code, str(exc.detail))


def _runs(request: Request) -> list[Run]:
    return request.app.state.runs


def _run(request: Request, index: str) -> Run:
    runs = _runs(request)
    try:
        i = int(index)
    except ValueError:
        raise BadQueryError(f"run index {index!r} is not an integer; GET /api/runs lists the runs") from None
    if not 0 <= i < len(runs):
        raise NotFoundError(
            f"unknown run index {i}; this viewer holds runs 0..{len(runs) - 1} (GET /api/runs)"
        )
    return runs[i]


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html")


@router.get("/api/runs")
def runs_list(request: Request) -> list[dict[str, Any]]:
    out = []
    for run in _runs(request):
        snap = run.snapshot()
        _, metric_warnings = run.metrics()
        envs = sorted(set(snap.table["env"].to_pylist())) if snap.table.num_rows else []
        out.append(
            {
                "index": run.index,
                "name": run.name,
                "path": str(run.path),
                "episodes": snap.table.num_rows,
                "steps": {"train": snap.steps("train"), "eval": snap.steps("eval")},
                "envs": envs,
                "has_store": snap.has_store,
                "warnings": snap.warnings + metric_warnings,
            }
        )
    return out


@router.get("/api/version")
def version(request: Request) -> dict[str, str]:
    state = json.dumps([run.version() for run in _runs(request)])
    return {"version": hashlib.sha1(state.encode()).hexdigest()[:16]}


@router.get("/api/runs/{index}/metrics")
def metrics(request: Request, index: str) -> dict[str, Any]:
    rows, warnings = _run(request, index).metrics()
    return {"rows": rows, "warnings": warnings}


@router.get("/api/runs/{index}/episodes")
def episodes(request: Request, index: str) -> dict[str, Any]:
    snap = _run(request, index).snapshot()
    params = dict(request.query_params)
    out = page(filter_table(snap.table, params), params)
    out["warnings"] = snap.warnings
    return out


@router.get("/api/runs/{index}/episode")
def episode(request: Request, index: str, key: str) -> dict[str, Any]:
    return json_safe(_run(request, index).episode(key))


@router.get("/api/runs/{index}/group")
def group(request: Request, index: str, kind: str, step: str, group_id: str) -> dict[str, Any]:
    run = _run(request, index)
    table = filter_table(run.snapshot().table, {"kind": kind, "step": step, "group_id": group_id})
    if table.num_rows == 0:
        raise NotFoundError(f"run {run.index} ({run.name}) has no group {group_id!r} at {kind} step {step}")
    table = table.sort_by("episode_index")
    rows = table.to_pylist()
    for row in rows:
        row["answer"] = final_answer(row.pop("messages"), limit=2000)
    return {"kind": kind, "step": int(step), "group_id": group_id, "episodes": json_safe(rows)}


@router.get("/api/runs/{index}/task/{task_id}")
def task(request: Request, index: str, task_id: str) -> dict[str, Any]:
    run = _run(request, index)
    tid = parse_int("task_id", task_id)
    table = filter_table(run.snapshot().table, {"task_id": str(tid)})
    if table.num_rows == 0:
        raise NotFoundError(f"run {run.index} ({run.name}) never played task {tid}")
    rows = table.to_pylist()
    for row in rows:
        row["answer"] = final_answer(row.pop("messages"), limit=600)
    steps = sorted(set(pc.unique(table["step"]).to_pylist()))
    return {"task_id": tid, "steps": steps, "episodes": json_safe(rows)}
