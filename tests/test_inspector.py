"""The memory inspector live (its ipywidgets, driven from Python) and how it decides whether it is live."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from atlas.core.memory import write_episode, write_memory
from atlas.notebook import inspector as insp
from atlas.notebook.inspector import MemoryInspector

pytestmark = pytest.mark.cluster


@pytest.fixture
def sarah_only(store):
    write_memory(store, "sarah", "Sarah lives in Bristol", "semantic", fact_type="location")
    return store


def live(store, user=None) -> MemoryInspector:
    return MemoryInspector(store, user, interactive=True)


def test_select_shows_a_user_the_first_list_did_not_have(sarah_only):
    inspector = live(sarah_only)
    assert inspector._picker.options == ("sarah",)
    write_episode(sarah_only, "tom", "My Lumio Hub v3 is in the hallway.", session_id="t1")
    inspector.select("tom")
    assert inspector.user == "tom" and inspector.current.user_id == "tom"
    assert inspector._picker.value == "tom" and inspector._picker.options == ("sarah", "tom")
    assert "memory of tom" in inspector._header.value and "Lumio Hub v3" in inspector._tabs.children[0].value


def test_refresh_reads_the_user_list_again_and_keeps_the_selection(sarah_only):
    inspector = live(sarah_only)
    write_episode(sarah_only, "anna", "I have a Lumio Plug in the study.", session_id="a1")
    inspector.refresh()
    assert inspector._picker.options == ("anna", "sarah")
    assert inspector._picker.value == "sarah" and inspector.current.user_id == "sarah"


def test_picking_in_the_dropdown_selects_the_user(sarah_only):
    write_episode(sarah_only, "tom", "My Lumio Hub v3 is in the hallway.", session_id="t1")
    inspector = live(sarah_only, "sarah")
    inspector._picker.value = "tom"
    assert inspector.current.user_id == "tom" and "memory of tom" in inspector._header.value
    assert inspector.changes() is None, "another user's read is no 'before'"


def test_changes_show_before_and_after_a_write(sarah_only):
    inspector = live(sarah_only, "sarah")
    assert inspector.changes() is None
    write_memory(sarah_only, "sarah", "Sarah's hub is called Beacon", "semantic", fact_type="device")
    inspector.refresh()
    changes = inspector.changes()
    semantic = dict(zip(changes.columns, changes.rows[changes.column("type").index("semantic")], strict=True))
    assert semantic["current"] == "1 → 2" and semantic["new"] == "Sarah's hub is called Beacon"
    assert "changes since the previous read of sarah" in inspector._header.value
    assert "1 → 2" in inspector.to_html() and "1 → 2" in str(inspector)


def test_live_bundle_carries_the_widget_and_the_static_snapshot(sarah_only):
    bundle = live(sarah_only)._repr_mimebundle_()
    assert {"application/vnd.jupyter.widget-view+json", "text/html", "text/plain"} <= set(bundle)
    assert "Sarah lives in Bristol" in bundle["text/html"]


def fake_shell(allow_stdin: bool | None) -> SimpleNamespace:
    content = {} if allow_stdin is None else {"allow_stdin": allow_stdin}
    return SimpleNamespace(kernel=SimpleNamespace(get_parent=lambda: {"content": content}))


@pytest.mark.parametrize(("shell", "expected"), [
    (None, False),                        # plain Python, no kernel
    (SimpleNamespace(), False),           # IPython in a terminal
    (fake_shell(False), False),           # papermill, nbconvert, nbclient, nbval
    (fake_shell(None), False),
    (fake_shell(True), True),             # JupyterLab, Notebook, VS Code
])
def test_live_when_the_frontend_can_answer(monkeypatch, shell, expected):
    monkeypatch.setattr(insp, "get_ipython", lambda: shell)
    assert insp.interactive_frontend() is expected
