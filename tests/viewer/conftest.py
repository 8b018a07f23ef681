"""The viewer tests' fixtures: hand-made runs, a viewer served on 127.0.0.1, one headless Chromium per module."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
HAVE_BROWSER = os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)
NO_BROWSER = "needs Debian's chromium and chromium-driver (scripts/system-deps.sh installs them as root)"


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go: $AGENTRL_TEST_ARTIFACTS (docs/viewer for the docs), else a temporary directory."""
    d = os.environ.get("AGENTRL_TEST_ARTIFACTS")
    out = Path(d) if d else tmp_path_factory.mktemp("viewer-screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """One headless Chromium, 1280x800, driven through Debian's chromedriver (selenium-manager never runs)."""
    if not HAVE_BROWSER:
        if os.environ.get("AGENTRL_REQUIRE_BROWSER") == "1":  # scripts/test.sh (CI): a missing browser fails
            pytest.fail(f"AGENTRL_REQUIRE_BROWSER=1 but chromium or chromedriver is missing: {NO_BROWSER}")
        pytest.skip(NO_BROWSER)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--window-size=1280,800", "--disable-gpu",
                "--disable-dev-shm-usage", "--hide-scrollbars"):  # fmt: skip
        opts.add_argument(arg)
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console, read by the tests
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    # --window-size sizes the window; make the page itself (the screenshots) 1280x800
    inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
    driver.set_window_size(1280 + 1280 - inner[0], 800 + 800 - inner[1])
    try:
        yield driver
    finally:
        driver.quit()
