"""KFP's own UI in a real browser: Debian's chromium driven by Playwright, against Service
``ml-pipeline-ui`` (hack/cluster/addons/kfp-ui.sh) through a port-forward, as a person opens it.

Fixtures: ``ui`` (the UI's address, port-forwarded for the module), ``browser`` (headless
chromium for the module) and ``page`` (a fresh page per test, with ``shot(page, name)`` saving
what a test checked). Each skips, with the reason, where chromium, Playwright or the UI's add-on
is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import kfp, kube

CHROMIUM = Path("/usr/bin/chromium")
"""Debian's chromium (`apt-get install chromium`; Playwright cannot download its own here)."""
SCREENSHOTS_ENV = "GPUPIPE_UI_SCREENSHOTS"
"""A folder that also receives every screenshot (the docs' pictures come from there)."""
VIEWPORT = {"width": 1920, "height": 1080}
"""Wide enough for the run page's side panel and the graph beside it."""
TIMEOUT_MS = 30_000
"""Playwright's wait for one element or navigation (the UI's pages load in about a second)."""
SUBMIT_S = 180
"""The wait for a form the UI sends to the API server (an upload, a run, a recurring run) to land
on its new page: the server's answer, not the page, takes the time when the other stream's step
pods hold both of this node's cores."""


def unavailable() -> str | None:
    """Why the browser tests cannot run here (None when they can)."""
    if not (kube.STATE / "addons" / "kfp-ui").is_dir():
        return "the kfp-ui add-on is not installed in this cluster (GPUPIPE_CLUSTER_ADDONS)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (make setup installs it from constraints.txt)"
    if not CHROMIUM.exists():
        return f"no chromium at {CHROMIUM} (as root: apt-get install -y chromium)"
    return None


@pytest.fixture(scope="module")
def ui() -> Iterator[str]:
    """``http://127.0.0.1:<free port>``: Service ml-pipeline-ui:80, port-forwarded."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with kfp.port_forward("ml-pipeline-ui", 80) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless chromium (the system's) under Playwright, for the module."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    try:
        chromium = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        try:
            yield chromium
        finally:
            chromium.close()
    finally:
        pw.stop()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A new page; when the test fails, what it showed is saved as ``<test>-failed.png``."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(TIMEOUT_MS)
    pg = context.new_page()
    try:
        yield pg
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            shot(pg, f"{request.node.name}-failed", request)
        context.close()


def _folder(request: pytest.FixtureRequest) -> Path:
    base = request.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    folder = Path(base) / "ui-screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def shot(page: Any, name: str, request: pytest.FixtureRequest) -> Path:
    """A screenshot ``<name>.png`` of the window (a page) or of one element (a locator) in the
    session's tmp folder (and in $GPUPIPE_UI_SCREENSHOTS when set); its path."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")
    path = _folder(request) / f"{safe}.png"
    page.screenshot(path=str(path))
    extra = os.environ.get(SCREENSHOTS_ENV)
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(extra) / path.name)
    return path


@pytest.fixture
def screenshot(request: pytest.FixtureRequest) -> Callable[[Any, str], Path]:
    """``screenshot(page, name)``: :func:`shot` bound to this test."""
    return lambda pg, name: shot(pg, name, request)


def lands_on(pg: Any, pattern: re.Pattern[str], what: str, wait_s: float = SUBMIT_S) -> str:
    """Wait after a form's submission until the page's URL matches PATTERN; that URL.

    The UI answers a refused submission with a dialog (its title and the API server's reason):
    that fails at once with the dialog's text, in one line. A submission that neither lands nor is
    refused in WAIT_S fails naming WHAT, where the page still is and what it shows."""
    deadline = time.monotonic() + wait_s
    dialog = pg.get_by_role("dialog")
    while True:
        if pattern.search(pg.url):
            return str(pg.url)
        if dialog.count() and dialog.first.is_visible():
            said = " ".join(dialog.first.inner_text().split())
            raise AssertionError(f"{what}: the UI refused it: {said}")
        if time.monotonic() > deadline:
            shows = " ".join(pg.locator("body").inner_text().split())[:600]
            raise AssertionError(
                f"{what}: no answer in {wait_s:.0f} s; the page is still {pg.url}, showing: {shows}"
            )
        pg.wait_for_timeout(250)
