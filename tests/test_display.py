"""The notebooks' printed requests (`atlas.notebook.display`): short enough to read, whole in a file to paste."""

from __future__ import annotations

import json

from atlas.core.schemas import build_component_template_body
from atlas.notebook.display import compact_json, show_json, show_request

VECTOR = [0.01 * i for i in range(768)]
REQUESTS = [{"path": "dense", "header": {"index": "p-episodic", "routing": "sarah"},
             "body": {"size": 80, "knn": {"field": "embedding", "query_vector": VECTOR, "k": 80,
                                          "filter": [{"term": {"user_id": "sarah"}}]}}}]


def test_compact_json_reads_back_and_fits_the_width():
    """Issue 21: notebook 01 printed 283 lines for the component template, 133 of them stop words."""
    body = build_component_template_body(768, 384)
    text = compact_json(body)
    assert json.loads(text) == body
    assert len(text.splitlines()) < len(json.dumps(body, indent=2).splitlines()) / 2
    assert max(len(line) for line in text.splitlines()) <= 100
    assert compact_json({"a": [1, 2]}) == '{"a": [1, 2]}' and compact_json([]) == "[]"


def test_a_printed_request_is_cut_short_and_its_file_pastes_whole(tmp_path, capsys):
    """The printed request elides the query vector; the file holds it whole, each line of the body valid JSON."""
    show_request(REQUESTS, pretty=True, save_to=tmp_path / "requests" / "dense.txt")
    printed = capsys.readouterr().out
    assert '"... 765 more"' in printed and "requests/dense.txt" in printed
    first, header, body = (tmp_path / "requests" / "dense.txt").read_text().splitlines()
    assert first == "GET _msearch" and json.loads(header) == REQUESTS[0]["header"]
    assert json.loads(body)["knn"]["query_vector"] == VECTOR


def test_long_json_is_folded_and_kept_whole_in_its_file(tmp_path, capsys):
    """Issue 35: a lesson prints the first lines of a long body and how many it left out; the file has all of it."""
    body = build_component_template_body(768, 384)
    show_json(body, lines=10, save_to=tmp_path / "template.json")
    printed = capsys.readouterr().out.splitlines()
    whole = compact_json(body).splitlines()
    assert printed[:10] == whole[:10] and printed[10] == f"... {len(whole) - 10} more lines"
    assert printed[11] == "(the whole of it is in tmp0/template.json)".replace("tmp0", tmp_path.name)
    assert json.loads((tmp_path / "template.json").read_text()) == body
    show_request(REQUESTS, pretty=True, lines=3)
    assert capsys.readouterr().out.splitlines()[-1].endswith("more lines")
