"""Lessons in a real browser: JupyterLab on the project's kernel, driven in headless Chromium (`-m browser`).

JupyterLab serves a copy of a lesson on a fresh index prefix; Playwright drives Debian's Chromium (`CHROMIUM`,
default /usr/bin/chromium: `make browser` installs it; nothing downloads a browser). Each test runs every cell above
the cleanup as a reader does, saves a screenshot to outputs/browser/, then runs the cleanup. The on-ramp (00) must
show its diagram of the loop, the agent lesson (08) its conversation with the local model; in lesson 07 the test
adds a second user from here, presses the inspector's Refresh, switches users in its picker and reads the memories
it renders.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import nbformat
import pytest
from papermill.parameterize import parameterize_notebook

from atlas.core.memory import write_episode
from atlas.core.schemas import all_indices
from atlas.notebook.runner import KERNEL, unique_prefix
from atlas.stack import open_store

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.browser, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SCREENSHOTS = ROOT / "outputs" / "browser"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
#: As the machine's notes say: headless, and no background connections a closed network refuses.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
#: Longest wait for a notebook's cells (about a minute with warm caches) and for one widget update.
RUN_TIMEOUT_MS, STEP_TIMEOUT_MS = 240_000, 30_000
TOM = "My Lumio Hub v3 sits on the bookshelf in the hallway."

#: [execution count or None, error or None] per code cell of the open notebook (JupyterLab's own model).
CELL_STATES = """() => Array.from(window.jupyterapp.shell.currentWidget.content.model.cells)
    .filter(c => c.type === 'code')
    .map(c => [c.executionCount, c.outputs.toJSON().filter(o => o.output_type === 'error')
                                      .map(o => o.ename + ': ' + o.evalue)[0] ?? null])"""

#: Run a notebook command with the cleanup (the last code cell; the exercises come after it) active, and wait
#: until it has run.
RUN = """async command => {
    const notebook = window.jupyterapp.shell.currentWidget.content;
    let cleanup = notebook.widgets.length - 1;
    while (notebook.widgets[cleanup].model.type !== 'code') cleanup--;
    notebook.activeCellIndex = cleanup;
    await window.jupyterapp.commands.execute(command);
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def lab(name: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """JupyterLab on a copy of lesson `name` (fresh prefix); yields (url of the notebook, prefix)."""
    notebook = NOTEBOOKS / name
    prefix = unique_prefix(notebook)
    nb = parameterize_notebook(nbformat.read(notebook, as_version=4),
                               {"INDEX_PREFIX": prefix, "OUT_DIR": str(tmp_path / "outputs")}, kernel_name=KERNEL)
    nbformat.write(nb, tmp_path / name)
    notification = tmp_path / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text('{"fetchNews": "false", "checkForUpdates": false}')  # no news prompt over the page
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "ATLAS_HOME": os.environ.get("ATLAS_HOME", str(ROOT)),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}
    log = (tmp_path / "lab.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
         "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
         "--LabApp.expose_app_in_browser=True"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, f"JupyterLab exited: {(tmp_path / 'lab.log').read_text()[-2000:]}"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "JupyterLab did not listen within 60 s"
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/lab/tree/{name}?token={token}", prefix
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@contextmanager
def page_after_running(url: str) -> Iterator[Page]:
    """Chromium on `url`, every cell above the cleanup run as a reader runs them (none failed); the cleanup runs
    when the block ends, and must pass."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).is_file(), f"no browser at {CHROMIUM}: `make browser` installs Debian's chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(STEP_TIMEOUT_MS)
        page.goto(url)
        page.wait_for_function("() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel"
                               "?.status === 'idle'", timeout=RUN_TIMEOUT_MS)
        page.evaluate(RUN, "notebook:run-all-above")
        states = page.evaluate(CELL_STATES)
        assert [e for _, e in states if e] == [] and None not in [n for n, _ in states[:-1]], states
        yield page
        page.evaluate(RUN, "notebook:run-cell")  # the cleanup
        cleanup = page.evaluate(CELL_STATES)[-1]
        browser.close()
    assert cleanup[0] is not None and cleanup[1] is None, cleanup


def screenshot(page: Page, name: str) -> Path:
    """A screenshot of the page as it is, into outputs/browser/<name>.png."""
    path = SCREENSHOTS / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=path)
    assert path.stat().st_size > 10_000
    return path


def left_behind(es, prefix: str) -> list[str]:
    return [i for i in all_indices(prefix) if es.indices.exists(index=i)]


def test_the_on_ramp_in_jupyterlab(es, tmp_path):
    """Lesson 00 as an attendee opens it first: the diagram of the loop is drawn, the capability table follows."""
    from playwright.sync_api import expect

    with lab("00_setup.ipynb", tmp_path) as (url, prefix), page_after_running(url) as page:
        diagram = page.locator(".jp-OutputArea-output img").first
        expect(diagram).to_be_visible()
        assert page.evaluate("img => img.naturalWidth", diagram.element_handle()) > 500
        diagram.scroll_into_view_if_needed()
        screenshot(page, "00_setup")
    assert not left_behind(es, prefix), "the cleanup cell left indices"


def test_the_agent_lesson_in_jupyterlab(es, local_llm, tmp_path):
    """Lesson 08 with the local model: the MCP session and the three-session conversation run in the browser."""
    from playwright.sync_api import expect

    with lab("08_mcp.ipynb", tmp_path) as (url, prefix), page_after_running(url) as page:
        outputs = page.locator(".jp-OutputArea-output")
        expect(outputs.filter(has_text="recall_memory").first).to_be_attached()
        conversation = outputs.filter(has_text="session 3").last
        expect(conversation).to_be_attached()
        conversation.scroll_into_view_if_needed()
        screenshot(page, "08_mcp")
    assert not left_behind(es, prefix), "the cleanup cell left indices"


def test_inspector_in_jupyterlab(es, tmp_path):
    """Lesson 07's memory inspector, live: a second user written from here appears after Refresh."""
    from playwright.sync_api import expect

    with lab("07_consolidation.ipynb", tmp_path) as (url, prefix), page_after_running(url) as page:
        widget = page.locator(".atlas-inspector.widget-vbox")
        expect(widget).to_have_count(1)  # live: the widget, not the static snapshot
        picker = widget.locator("select")
        expect(picker).to_have_value("sarah")
        expect(widget).to_contain_text("changes since the previous read of sarah")  # the refresh cell's

        write_episode(open_store(prefix, es=es), "tom", TOM, session_id="t1")
        widget.get_by_role("button", name="Refresh").click()
        expect(picker.locator("option")).to_have_text(["sarah", "tom"])
        picker.select_option("tom")
        expect(widget).to_contain_text("memory of tom")
        expect(widget.locator(".widget-tab-contents")).to_contain_text(TOM)
        picker.select_option("sarah")
        expect(widget).to_contain_text("memory of sarah")
        expect(widget.locator(".widget-tab-contents")).to_contain_text("Beacon is still in the hallway cupboard")
        widget.get_by_role("tab", name="semantic").click()
        expect(widget).to_contain_text("supersession chains")
        widget.scroll_into_view_if_needed()
        screenshot(page, "07_inspector")
    assert not left_behind(es, prefix), "the cleanup cell left indices"
