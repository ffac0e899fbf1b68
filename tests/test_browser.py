"""Notebook 06 in a real browser: JupyterLab on the project's kernel, driven in headless Chromium (`-m browser`).

JupyterLab serves a copy of the notebook on a fresh index prefix; Playwright drives Debian's Chromium
(`CHROMIUM`, default /usr/bin/chromium: `make browser` installs it; nothing downloads a browser). The test runs
every cell above the cleanup, adds a second user from here, presses the inspector's Refresh, switches users in
its picker and reads the memories it renders, saves a screenshot to outputs/browser/, then runs the cleanup.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from papermill.parameterize import parameterize_notebook

from atlas.core.memory import write_episode
from atlas.core.schemas import all_indices
from atlas.notebook.runner import KERNEL, unique_prefix
from atlas.stack import open_store

pytestmark = [pytest.mark.browser, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "06_consolidation.ipynb"
SCREENSHOT = ROOT / "outputs" / "browser" / "06_inspector.png"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
#: As the machine's notes say: headless, and no background connections a closed network refuses.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
#: Longest wait for the notebook's cells (about a minute with warm caches) and for one widget update.
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


@pytest.fixture
def lab(tmp_path) -> Iterator[tuple[str, str]]:
    """JupyterLab on a copy of notebook 06 (fresh prefix); yields (url of the notebook, prefix)."""
    prefix = unique_prefix(NOTEBOOK)
    nb = parameterize_notebook(nbformat.read(NOTEBOOK, as_version=4),
                               {"INDEX_PREFIX": prefix, "OUT_DIR": str(tmp_path / "outputs")}, kernel_name=KERNEL)
    nbformat.write(nb, tmp_path / NOTEBOOK.name)
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
        yield f"http://127.0.0.1:{port}/lab/tree/{NOTEBOOK.name}?token={token}", prefix
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_inspector_in_jupyterlab(lab, es):
    from playwright.sync_api import expect, sync_playwright

    assert Path(CHROMIUM).is_file(), f"no browser at {CHROMIUM}: `make browser` installs Debian's chromium"
    url, prefix = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(STEP_TIMEOUT_MS)
        page.goto(url)
        page.wait_for_function("() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel"
                               "?.status === 'idle'", timeout=RUN_TIMEOUT_MS)
        # Every cell above the cleanup, as a reader runs them.
        page.evaluate(RUN, "notebook:run-all-above")
        states = page.evaluate(CELL_STATES)
        assert [e for _, e in states if e] == [] and None not in [n for n, _ in states[:-1]], states

        widget = page.locator(".atlas-inspector.widget-vbox")
        expect(widget).to_have_count(1)  # live: the widget, not the static snapshot
        picker = widget.locator("select")
        expect(picker).to_have_value("sarah")
        expect(widget).to_contain_text("changes since the previous read of sarah")  # cell 17's refresh

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
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        widget.scroll_into_view_if_needed()
        page.screenshot(path=SCREENSHOT)

        page.evaluate(RUN, "notebook:run-cell")  # the cleanup
        cleanup = page.evaluate(CELL_STATES)[-1]
        browser.close()
    assert cleanup[0] is not None and cleanup[1] is None, cleanup
    assert SCREENSHOT.stat().st_size > 10_000
    assert not [i for i in all_indices(prefix) if es.indices.exists(index=i)], "the cleanup cell left indices"
