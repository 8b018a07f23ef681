"""The viewer's JSON API over real HTTP on 127.0.0.1, and the `agentrl view` command.

Every bad input is a 4xx with a message (never a 500); a run without a store, a half-written file and a
file of another schema version are warnings while the rest is served; a live run is re-read file by file.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from store_helpers import G, append_metrics, make_run, metrics_row, step_rows

import agentrl.rollouts as store
import agentrl.viewer.runs as viewer_runs
from agentrl.httpkit import BackgroundServer
from agentrl.rollouts import EPISODE_COLUMNS, TOKEN_COLUMNS, RolloutWriter
from agentrl.viewer import make_app
from agentrl.viewer.errors import ViewerError
from agentrl.viewer.query import FILTERS


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    good = make_run(root / "good")
    nostore = root / "nostore"
    nostore.mkdir()
    append_metrics(nostore, metrics_row("train", 1), metrics_row("train", 2))
    broken = make_run(root / "broken", steps=2, evals=False)
    (broken / "rollouts" / "train-000009.parquet").write_bytes(b"PAR1\x00\x01garbage, cut short")
    old = make_run(root / "old", steps=1, evals=False)
    table = pa.Table.from_pylist(
        step_rows("train", 5), schema=store.SCHEMA.with_metadata({"agentrl.rollouts.schema": "0"})
    )
    pq.write_table(table, old / "rollouts" / "train-000005.parquet")
    return {"good": good, "nostore": nostore, "broken": broken, "old": old}


@pytest.fixture(scope="module")
def client(runs: dict[str, Path]) -> Iterator[httpx.Client]:
    app = make_app([runs["good"], runs["nostore"], runs["broken"], runs["old"]])
    with BackgroundServer(app, name="viewer") as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        yield c


def _get(client: httpx.Client, path: str, **params: Any) -> Any:
    r = client.get(path, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_runs_list(client: httpx.Client, runs: dict[str, Path]) -> None:
    listed = _get(client, "/api/runs")
    assert [r["name"] for r in listed] == ["good", "nostore", "broken", "old"]
    good = listed[0]
    assert good["episodes"] == store.load(runs["good"]).num_rows == 32
    assert good["steps"] == {"train": [1, 2, 3], "eval": [3]}
    assert good["envs"] == ["calculator-v0"] and good["warnings"] == [] and good["has_store"]


def test_run_without_store_still_serves_its_curves(client: httpx.Client) -> None:
    run = _get(client, "/api/runs")[1]
    assert not run["has_store"] and run["episodes"] == 0
    assert len(run["warnings"]) == 1 and run["warnings"][0].startswith("no store:")
    assert "--save-rollouts" in run["warnings"][0]
    assert [r["step"] for r in _get(client, "/api/runs/1/metrics")["rows"]] == [1, 2]
    assert _get(client, "/api/runs/1/episodes")["total"] == 0


def test_half_written_file_is_a_warning_and_the_rest_is_served(
    client: httpx.Client, runs: dict[str, Path]
) -> None:
    run = _get(client, "/api/runs")[2]
    assert len(run["warnings"]) == 1
    assert (
        "train-000009.parquet" in run["warnings"][0] and "not a complete Parquet file" in run["warnings"][0]
    )
    page = _get(client, "/api/runs/2/episodes")
    assert page["total"] == run["episodes"] == 2 * 2 * G and page["warnings"] == run["warnings"]
    assert _get(client, "/api/runs/2/episode", key="train/2/g0/1")["key"] == "train/2/g0/1"
    r = client.get("/api/runs/2/episode", params={"key": "train/9/g0/0"})
    assert r.status_code == 400 and "not a complete Parquet file" in r.json()["error"]


def test_file_of_another_schema_version_is_named(client: httpx.Client) -> None:
    run = _get(client, "/api/runs")[3]
    assert len(run["warnings"]) == 1
    w = run["warnings"][0]
    assert "train-000005.parquet" in w and "schema 0" in w and "reads schema 1" in w
    assert run["episodes"] == 2 * G  # step 1 is still served


@pytest.mark.parametrize(
    ("path", "params", "status", "says"),
    [
        ("/api/runs/7/metrics", {}, 404, "unknown run index 7; this viewer holds runs 0..3"),
        ("/api/runs/x/episodes", {}, 400, "run index 'x' is not an integer"),
        ("/api/runs/0/episodes", {"reward_min": "high"}, 400, "reward_min='high' is not a number"),
        ("/api/runs/0/episodes", {"reward_max": "nan"}, 400, "reward_max='nan' is not a number"),
        ("/api/runs/0/episodes", {"step": "2.5"}, 400, "step='2.5' is not an integer"),
        ("/api/runs/0/episodes", {"task_id": "9" * 30}, 400, f"task_id='{'9' * 30}' is out of range"),
        ("/api/runs/0/episodes", {"kind": "test"}, 400, "kind='test' is not one of train, eval"),
        (
            "/api/runs/0/episodes",
            {"fate": "lost"},
            400,
            "fate='lost' is not one of trained, filtered, dropped, eval",
        ),
        (
            "/api/runs/0/episodes",
            {"status": "bad"},
            400,
            "status='bad' is not one of ok, model_error, infra_error",
        ),
        ("/api/runs/0/episodes", {"rewrad_min": "1"}, 400, "unknown filter 'rewrad_min'"),
        ("/api/runs/0/episodes", {"limit": "0"}, 400, "limit='0' must be >= 1"),
        ("/api/runs/0/episodes", {"limit": "100000"}, 400, "limit=100000 is over 500"),
        ("/api/runs/0/episodes", {"offset": "-1"}, 400, "offset='-1' must be >= 0"),
        ("/api/runs/0/episode", {}, 400, "invalid request: query.key: Field required"),
        ("/api/runs/0/episode", {"key": "nonsense"}, 404, "episode key 'nonsense' is not of the form"),
        ("/api/runs/0/episode", {"key": "train/7/g0/0"}, 404, "has no train step 7"),
        ("/api/runs/0/episode", {"key": "train/1/g9/0"}, 404, "has no episode 'train/1/g9/0'"),
        (
            "/api/runs/0/group",
            {"kind": "train", "step": "1", "group_id": "g9"},
            404,
            "no group 'g9' at train step 1",
        ),
        (
            "/api/runs/0/group",
            {"kind": "train", "step": "one", "group_id": "g0"},
            400,
            "step='one' is not an integer",
        ),
        ("/api/runs/0/task/55", {}, 404, "never played task 55"),
        ("/api/runs/0/task/abc", {}, 400, "task_id='abc' is not an integer"),
        ("/api/nothing", {}, 404, "no such page or endpoint '/api/nothing'"),
    ],
)
def test_bad_input_is_a_4xx_with_a_message(
    client: httpx.Client, path: str, params: dict[str, str], status: int, says: str
) -> None:
    r = client.get(path, params=params)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]


@given(
    params=st.dictionaries(
        st.sampled_from([*FILTERS, "offset", "limit", "bogus"]),
        st.one_of(st.text(max_size=24), st.integers(-(2**70), 2**70).map(str), st.floats().map(str)),
        max_size=4,
    )
)
def test_no_query_is_answered_with_a_500(client: httpx.Client, params: dict[str, str]) -> None:
    r = client.get("/api/runs/0/episodes", params=params)
    assert r.status_code in (200, 400), r.text
    assert r.status_code == 200 or r.json()["error"]


def test_filters_combine(client: httpx.Client, runs: dict[str, Path]) -> None:
    rows = store.load(runs["good"]).to_pylist()

    def keys(**params: Any) -> list[str]:
        return sorted(e["key"] for e in _get(client, "/api/runs/0/episodes", limit=500, **params)["episodes"])

    assert keys(kind="eval") == sorted(r["key"] for r in rows if r["kind"] == "eval")
    assert keys(step_min=2, step_max=3, kind="train") == sorted(
        r["key"] for r in rows if r["kind"] == "train" and 2 <= r["step"] <= 3
    )
    assert keys(task_id=1001, status="model_error") == sorted(
        r["key"] for r in rows if r["task_id"] == 1001 and r["status"] == "model_error"
    )
    assert keys(q="what is 13") == sorted(r["key"] for r in rows if r["group_id"] == "g1")
    assert keys(turns=3) == []
    page = _get(client, "/api/runs/0/episodes", offset=30, limit=10)
    assert page["total"] == 32 and len(page["episodes"]) == 2
    assert not set(TOKEN_COLUMNS) & set(page["episodes"][0]) and "messages" not in page["episodes"][0]
    assert page["episodes"][0]["preview"].startswith("The answer is")


def test_episode_group_and_task(client: httpx.Client, runs: dict[str, Path]) -> None:
    rows = store.load(runs["good"]).to_pylist()
    ep = _get(client, "/api/runs/0/episode", key="train/3/g1/2")
    want = next(r for r in rows if r["key"] == "train/3/g1/2")
    assert set(ep) == set(EPISODE_COLUMNS) | set(TOKEN_COLUMNS)
    assert ep["pieces"] == want["pieces"] and ep["loss_mask"] == want["loss_mask"]
    assert ep["logprobs"] == pytest.approx(want["logprobs"])
    group = _get(client, "/api/runs/0/group", kind="train", step=3, group_id="g1")["episodes"]
    assert [e["key"] for e in group] == [f"train/3/g1/{i}" for i in range(G)]
    assert [e["advantage"] for e in group] == [
        r["advantage"] for r in rows if r["key"].startswith("train/3/g1/")
    ]
    task = _get(client, "/api/runs/0/task/1000")
    assert task["steps"] == [1, 2, 3]
    assert sorted(e["key"] for e in task["episodes"]) == sorted(
        r["key"] for r in rows if r["task_id"] == 1000
    )
    assert [e["step"] for e in task["episodes"]] == sorted(e["step"] for e in task["episodes"])


def test_live_run_is_reread_file_by_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(tmp_path / "live", steps=2, evals=False)
    reads: list[str] = []
    real = viewer_runs.read_file
    monkeypatch.setattr(
        viewer_runs, "read_file", lambda path, *a, **k: reads.append(Path(path).name) or real(path, *a, **k)
    )
    with (
        BackgroundServer(make_app([run]), name="viewer") as srv,
        httpx.Client(base_url=srv.url, timeout=30) as c,
    ):
        v0 = c.get("/api/version").json()["version"]
        assert c.get("/api/runs/0/episodes").json()["total"] == 2 * 2 * G
        assert c.get("/api/runs/0/episodes").json()["total"] == 2 * 2 * G
        assert sorted(reads) == ["train-000001.parquet", "train-000002.parquet"]  # each once
        RolloutWriter(run).write("train", 3, step_rows("train", 3))
        v1 = c.get("/api/version").json()["version"]
        assert v1 != v0
        assert c.get("/api/runs/0/episodes").json()["total"] == 3 * 2 * G
        assert reads[2:] == ["train-000003.parquet"]  # only the new file
        append_metrics(run, metrics_row("train", 3))
        assert c.get("/api/version").json()["version"] != v1
        with (run / "metrics.jsonl").open("a") as fh:  # a row being written: left for the next poll
            fh.write('{"kind": "train", "step": 4, "rollout/rew')
        rows = c.get("/api/runs/0/metrics").json()
        assert [r["step"] for r in rows["rows"]] == [1, 2, 3] and rows["warnings"] == []


def test_a_file_moved_while_listed_is_listed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumed run moves files aside while the viewer lists them: the listing is taken again, not a 500."""
    run = make_run(tmp_path / "run", steps=1, evals=False)
    calls = []

    def flaky(run_dir: Any) -> Any:
        calls.append(run_dir)
        if len(calls) == 1:
            raise FileNotFoundError("train-000002.parquet")
        return store.list_files(run_dir)

    monkeypatch.setattr(viewer_runs, "list_files", flaky)
    with BackgroundServer(make_app([run]), name="viewer") as srv:
        assert httpx.get(srv.url + "/api/runs/0/episodes", timeout=30).json()["total"] == 2 * G
    assert len(calls) == 2


def test_make_app_refuses_a_directory_that_is_no_run(tmp_path: Path) -> None:
    with pytest.raises(ViewerError, match="not a run directory"):
        make_app([tmp_path])
    with pytest.raises(ViewerError, match="no such directory"):
        make_app([tmp_path / "missing"])
    make_run(tmp_path / "a", steps=1, evals=False)
    make_run(tmp_path / "b", steps=1, evals=False)
    with pytest.raises(ViewerError, match="not a run directory .*; it holds the runs a, b: pass those"):
        make_app([tmp_path])


def _cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "view", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_view_command_bad_run_dir_is_one_line_and_exit_2(tmp_path: Path) -> None:
    p = _cli(str(tmp_path / "nope"))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2
    assert err.strip().splitlines() == [f"agentrl view: error: {tmp_path / 'nope'}: no such directory; "
                                         "pass a run directory such as runs/<name>"]  # fmt: skip
    assert "Traceback" not in err


def test_view_command_serves_until_ctrl_c(runs: dict[str, Path]) -> None:
    p = _cli(str(runs["good"]), "--port", "0")
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.startswith("agentrl view: 1 run(s) at http://127.0.0.1:"), line
        url = line.split(" at ")[1].split()[0]
        assert httpx.get(url + "api/runs", timeout=30).json()[0]["episodes"] == 32
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200 and "/static/app.js" in page.text
        assert httpx.get(url + "static/app.js", timeout=30).status_code == 200
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0 and "Traceback" not in err
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()


def test_static_files_are_package_data() -> None:
    import tomllib

    data = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["agentrl"]
    static = sorted(p.name for p in (Path(viewer_runs.__file__).parent / "static").iterdir())
    assert static == ["app.js", "index.html", "style.css"]
    for name in static:
        assert any(Path("viewer/static", name).match(g) for g in globs), name
