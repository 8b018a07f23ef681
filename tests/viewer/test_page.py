"""The viewer's page in a real browser (headless Chromium): the table, filters, an episode's tokens, a group,
a task across training, curves of several runs, and a live run followed without a reload."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from store_helpers import append_metrics, make_row, make_run, metrics_row, step_rows

import agentrl.rollouts as store
from agentrl.httpkit import BackgroundServer
from agentrl.rollouts import RolloutWriter
from agentrl.viewer import make_app

pytestmark = pytest.mark.browser
WAIT_S = 20  # a deadline for the page to catch up, never a speed assertion


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    main = make_run(root / "calculator-main")
    agent = make_row("eval", 0, 0, 0, task_id=2000) | {"messages": None}  # an agent program's: tokens only
    RolloutWriter(main).write("eval", 0, [agent])
    live = make_run(root / "calculator-live", steps=2, evals=False, bias=0.15)
    bad = make_run(root / "calculator-bad", steps=1, evals=False, bias=-0.1)
    (bad / "rollouts" / "train-000009.parquet").write_bytes(b"PAR1 half a file")
    return [main, live, bad]


@pytest.fixture(scope="module")
def url(runs: list[Path]) -> Iterator[str]:
    with BackgroundServer(make_app(runs), name="viewer") as srv:
        yield srv.url


def _wait(driver: Any, cond: Any, what: str) -> Any:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    ignored = (NoSuchElementException, StaleElementReferenceException)  # the page redrew mid-read: read again
    wait = WebDriverWait(driver, WAIT_S, poll_frequency=0.1, ignored_exceptions=ignored)
    return wait.until(lambda d: cond(d), message=what)


_LOADS = iter(range(1_000_000))


def _open(driver: Any, url: str, hash_: str) -> None:
    """Load the page afresh at ``hash_`` and wait until that view has drawn.

    A new query string each time: a URL that differs only in its hash would not reload the page.
    """
    view = hash_.split("?")[0].strip("#/")
    driver.get(f"{url}/?load={next(_LOADS)}#/{hash_.lstrip('#/')}")
    _wait(
        driver,
        lambda d: d.find_element("tag name", "body").get_attribute("data-view") == view,
        f"view {view}",
    )


def _css(driver: Any, sel: str) -> list[Any]:
    return driver.find_elements("css selector", sel)


def _shot(driver: Any, artifacts: Path, name: str) -> None:
    """A 1280x800 screenshot, as a 256-colour PNG (a third of the size; docs/viewer/ holds these)."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGB")
    image.quantize(256, method=Image.Quantize.FASTOCTREE).save(artifacts / f"{name}.png", optimize=True)


def _keys(driver: Any, sel: str) -> list[str]:
    """The ``data-key`` of every element ``sel`` selects, read in one script (no element goes stale between reads)."""
    return driver.execute_script(  # type: ignore[no-any-return]
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.dataset.key)", sel
    )


def test_curves_overlay_runs_with_a_legend(browser: Any, url: str, artifacts: Path) -> None:
    _open(browser, url, "curves")
    titles = [c.get_attribute("data-title") for c in _css(browser, "#charts .chart")]
    # only the metrics present: the hand-made runs log no sync time and no turns
    assert titles == [
        "Reward",
        "Completion tokens",
        "Entropy",
        "Clip fraction",
        "KL",
        "Staleness (versions)",
        "Step time (s)",
    ]
    reward = _css(browser, '#charts .chart[data-title="Reward"] path.series')
    drawn = {(p.get_attribute("data-run"), p.get_attribute("data-key")) for p in reward}
    assert drawn == {
        ("0", "rollout/reward"),
        ("0", "eval/reward"),
        ("1", "rollout/reward"),
        ("2", "rollout/reward"),
    }
    assert "calculator-main" in browser.find_element("css selector", "#runs").text
    # unticking a run removes its lines
    browser.find_element("css selector", '#runs input[data-run="2"]').click()
    _wait(browser, lambda d: not _css(d, 'path.series[data-run="2"]'), "run 2's curves gone")
    _shot(browser, artifacts, "curves")
    browser.find_element("css selector", '#runs input[data-run="2"]').click()


def test_a_half_written_file_is_a_warning_on_the_page(browser: Any, url: str) -> None:
    _open(browser, url, "curves")
    warnings = [w.text for w in _css(browser, "#warnings .warning")]
    assert len(warnings) == 1
    assert "calculator-bad" in warnings[0] and "train-000009.parquet" in warnings[0]


def test_table_lists_every_stored_episode(browser: Any, url: str, runs: list[Path], artifacts: Path) -> None:
    table = store.load(runs[0])
    _open(browser, url, "episodes?run=0")
    assert int(browser.find_element("id", "ep-total").get_attribute("data-total")) == table.num_rows
    assert sorted(_keys(browser, "#ep-table tr.ep-row")) == sorted(table["key"].to_pylist())
    _shot(browser, artifacts, "episodes")


def test_reward_filter_shows_exactly_the_matching_episodes(browser: Any, url: str, runs: list[Path]) -> None:
    rows = store.load(runs[0], columns=["key", "reward"]).to_pylist()
    want = sorted(r["key"] for r in rows if 0.5 <= r["reward"] <= 0.75)
    assert 0 < len(want) < len(rows)
    _open(browser, url, "episodes?run=0")
    for name, value in (("reward_min", "0.5"), ("reward_max", "0.75")):
        browser.find_element("id", f"f-{name}").send_keys(value)
    browser.find_element("id", "apply").click()
    _wait(
        browser,
        lambda d: d.find_element("id", "ep-total").get_attribute("data-total") == str(len(want)),
        "filtered",
    )
    assert sorted(_keys(browser, "#ep-table tr.ep-row")) == want
    assert "reward_min=0.5" in browser.current_url  # the filters live in the URL: a link reproduces the view


def test_text_search_and_a_bad_filter_value(browser: Any, url: str, runs: list[Path]) -> None:
    rows = store.load(runs[0], columns=["key", "error"]).to_pylist()
    want = sorted(r["key"] for r in rows if r["error"] and "about 400" in r["error"])
    _open(browser, url, "episodes?run=0&q=ABOUT%20400")
    assert sorted(_keys(browser, "#ep-table tr.ep-row")) == want and want
    _open(browser, url, "episodes?run=0&turns=two")
    assert "turns='two' is not an integer" in browser.find_element("id", "ep-error").text
    assert not _css(browser, "#ep-table tr.ep-row")


def _episode(run_dir: Path, key: str) -> dict[str, Any]:
    t = store.load(run_dir)
    return next(r for r in t.to_pylist() if r["key"] == key)


def test_episode_page_shows_its_text_and_one_coloured_span_per_sampled_token(
    browser: Any, url: str, runs: list[Path], artifacts: Path
) -> None:
    key = "train/2/g1/2"
    ep = _episode(runs[0], key)
    _open(browser, url, "episodes?run=0")
    browser.find_element("css selector", f'#ep-table tr.ep-row[data-key="{key}"] td:nth-child(2)').click()
    _wait(browser, lambda d: d.find_element("id", "episode-key").text == key, "the episode page")
    conversation = browser.find_element("id", "conversation").text
    for m in json.loads(ep["messages"]):
        assert (m["content"] or "") in conversation
    assert '{"expr": "13*32"}' in conversation  # the tool call's arguments, as the model wrote them
    assert browser.find_element("id", "tokens").get_attribute("textContent") == "".join(ep["pieces"])
    sampled = _css(browser, "#tokens span.tok.sampled")
    assert len(sampled) == sum(ep["loss_mask"])
    assert [int(s.get_attribute("data-i")) for s in sampled] == [
        i for i, m in enumerate(ep["loss_mask"]) if m
    ]
    assert all("background" in (s.get_attribute("style") or "") for s in sampled)
    assert len(_css(browser, "#tokens span.tok.ctx")) == len(ep["loss_mask"]) - sum(ep["loss_mask"])
    _shot(browser, artifacts, "episode")

    # colour by Δlogp: each sampled token carries train_logprobs - logprobs
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", "color-by")).select_by_value("dlogp")
    values = [float(s.get_attribute("data-v")) for s in _css(browser, "#tokens span.tok.sampled")]
    want = [t - b for t, b, m in zip(ep["train_logprobs"], ep["logprobs"], ep["loss_mask"], strict=True) if m]
    assert values == pytest.approx(want, abs=1e-5)
    browser.find_element("id", "raw-ids").click()
    ids = browser.find_element("id", "tokens").get_attribute("textContent").split()
    assert [int(i) for i in ids] == ep["token_ids"]


def test_eval_episode_offers_only_what_was_stored(browser: Any, url: str) -> None:
    _open(browser, url, "episode?run=0&key=eval/3/g0/0")
    options = {
        o.get_attribute("value"): o.get_attribute("disabled") is None
        for o in _css(browser, "#color-by option")
    }
    assert options == {
        "logprobs": True,
        "dlogp": False,
        "advantages": False,
        "entropy": False,
        "staleness": False,
    }
    assert _css(browser, "#tokens span.tok.sampled")


def test_episode_without_messages_shows_its_tokens_by_turn(browser: Any, url: str, runs: list[Path]) -> None:
    ep = _episode(runs[0], "eval/0/g0/0")
    assert ep["messages"] is None
    _open(browser, url, "episode?run=0&key=eval/0/g0/0")
    _wait(browser, lambda d: d.find_element("id", "episode-key").text == "eval/0/g0/0", "the episode page")
    blocks = browser.execute_script(
        "return Array.from(document.querySelectorAll('#conversation .msg'), m => [m.dataset.role, "
        "m.querySelector('pre') ? m.querySelector('pre').textContent : ''])"
    )
    p, (s1, s2), (e1, e2) = ep["pieces"], ep["turn_starts"], ep["turn_ends"]
    assert blocks == [
        ["context", "".join(p[:s1])], ["assistant", "".join(p[s1:e1])],
        ["context", "".join(p[e1:s2])], ["assistant", "".join(p[s2:e2])],
    ]  # fmt: skip
    assert len(_css(browser, "#tokens span.tok.sampled")) == sum(ep["loss_mask"])


def test_group_view_shows_the_groups_episodes(
    browser: Any, url: str, runs: list[Path], artifacts: Path
) -> None:
    rows = store.load(runs[0]).to_pylist()
    want = [r for r in rows if (r["kind"], r["step"], r["group_id"]) == ("train", 2, "g1")]
    _open(browser, url, "episode?run=0&key=train/2/g1/2")
    browser.find_element("id", "to-group").click()
    _wait(browser, lambda d: len(_css(d, "#group-eps .group-ep")) == len(want), "the group")
    cards = _css(browser, "#group-eps .group-ep")
    assert [c.get_attribute("data-key") for c in cards] == [
        r["key"] for r in sorted(want, key=lambda r: r["episode_index"])
    ]
    for card, r in zip(cards, sorted(want, key=lambda r: r["episode_index"]), strict=True):
        assert float(card.get_attribute("data-reward")) == r["reward"]
        assert f"adv {r['advantage']:.3g}".rstrip("0") in card.text or f"adv {r['advantage']}" in card.text
        assert json.loads(r["messages"])[-1]["content"] in card.text
    _shot(browser, artifacts, "group")


def test_task_view_shows_the_task_at_every_step(
    browser: Any, url: str, runs: list[Path], artifacts: Path
) -> None:
    rows = store.load(runs[0]).to_pylist()
    want = [r for r in rows if r["task_id"] == 1000]
    assert {r["kind"] for r in want} == {"train", "eval"}
    _open(browser, url, "episodes?run=0")
    browser.find_element("css selector", '#ep-table tr.ep-row[data-key="train/1/g0/0"] a.task-link').click()
    _wait(browser, lambda d: len(_css(d, "#task-table tr.task-ep")) == len(want), "the task's episodes")
    shown = _css(browser, "#task-table tr.task-ep")
    steps = [int(s.get_attribute("data-step")) for s in shown]
    assert steps == sorted(steps) and set(steps) == {1, 2, 3}
    assert sorted(s.get_attribute("data-key") for s in shown) == sorted(r["key"] for r in want)
    _shot(browser, artifacts, "task")


def test_live_run_appears_without_a_reload(browser: Any, url: str, runs: list[Path]) -> None:
    live = runs[1]
    before = store.load(live).num_rows
    _open(browser, url, "episodes?run=1")
    assert browser.find_element("id", "ep-total").get_attribute("data-total") == str(before)
    browser.execute_script("window.__same_page = true")
    RolloutWriter(live).write("train", 3, step_rows("train", 3))
    append_metrics(live, metrics_row("train", 3, 0.15))
    new = {r["key"] for r in step_rows("train", 3)}
    _wait(
        browser,
        lambda d: d.find_element("id", "ep-total").get_attribute("data-total") == str(before + len(new)),
        "new step",
    )
    assert new <= set(_keys(browser, "#ep-table tr.ep-row"))
    browser.find_element("id", "nav-curves").click()

    def points(d: Any) -> int:  # the run's reward curve: "M x,y" then one "L x,y" per further point
        sel = 'path.series[data-run="1"][data-key="rollout/reward"]'
        return (
            int(d.execute_script(f"return document.querySelector('{sel}').getAttribute('d')").count("L")) + 1
        )

    _wait(
        browser, lambda d: d.find_element("tag name", "body").get_attribute("data-view") == "curves", "curves"
    )
    _wait(browser, lambda d: points(d) == 3, "steps 1, 2 and the new 3 on the curve")
    append_metrics(live, metrics_row("train", 4, 0.15))
    _wait(browser, lambda d: points(d) == 4, "a new metric row on the curve")
    assert browser.execute_script("return window.__same_page") is True


def test_the_page_logs_no_script_error(browser: Any, url: str) -> None:
    """Every view this module opened ran without a JavaScript error (a 4xx the page asked for on purpose,
    a bad filter value, is the only console line allowed)."""
    for view in ("curves", "episodes?run=2", "episode?run=0&key=train/1/g0/0", "task?run=0&task_id=1001"):
        _open(browser, url, view)
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert [m for m in errors if "status of 400" not in m] == []
