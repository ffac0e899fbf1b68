"""The capability table of docs/elasticsearch.md is what the local cluster really does.

`atlas.ops.capabilities.probe` runs once per module against the connected cluster. The doc's table
must equal `render_markdown(probe(es))` on the local node (skipped when ES_URL points at another
cluster, whose distribution may differ), and every gap it lists must really be a gap.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from elasticsearch import AuthenticationException, Elasticsearch

from atlas.config import load_settings
from atlas.ops import capabilities as caps
from atlas.ops.capabilities import Capability, probe, render_markdown

pytestmark = pytest.mark.cluster

DOC = Path(__file__).resolve().parents[1] / "docs" / "elasticsearch.md"
START, END = "<!-- capabilities:start -->", "<!-- capabilities:end -->"
LOCAL = load_settings().local
only_local = pytest.mark.skipif(not LOCAL, reason="ES_URL points at another cluster; the doc describes the local node")


def doc_table() -> str:
    text = DOC.read_text()
    assert START in text and END in text, f"{DOC} lacks the {START} / {END} markers"
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def doc_rows() -> dict[str, bool]:
    """{capability: supported} as the doc states it."""
    rows = {}
    for line in doc_table().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert cells[1] in {"yes", "no"}, f"unreadable row in {DOC.name}: {line}"
        rows[cells[0]] = cells[1] == "yes"
    return rows


@pytest.fixture(scope="module")
def capabilities(es) -> dict[str, Capability]:
    return {c.name: c for c in probe(es)}


@only_local
def test_doc_table_is_the_probe_output(es, capabilities):
    expected = render_markdown(list(capabilities.values()))
    assert doc_table() == expected, (
        "docs/elasticsearch.md is stale: run `atlas es capabilities --markdown` and paste the output between "
        f"the markers.\nfresh probe:\n{expected}"
    )


@only_local
def test_every_listed_gap_is_missing(capabilities):
    gaps = [name for name, supported in doc_rows().items() if not supported]
    assert gaps, "the doc lists no gap: the local distribution is expected to lack several modules"
    for name in gaps:
        assert name in capabilities, f"{name} is in the doc but no longer probed"
        assert not capabilities[name].supported, f"{name} is listed as missing but the local node supports it"
        assert capabilities[name].workaround, f"{name} is missing but the doc names no workaround"


def test_security_is_on(es, capabilities):
    assert capabilities["security + trial license"].supported, capabilities["security + trial license"].detail
    settings = load_settings()
    anonymous = Elasticsearch(settings.url, ca_certs=settings.es_ca_certs, request_timeout=10)
    with pytest.raises(AuthenticationException):
        anonymous.search(index="_all", size=0)


def test_license_allows_dls(es):
    lic = es.license.get()["license"]
    assert lic["status"] == "active"
    assert lic["type"] in {"trial", "platinum", "enterprise"}, f"license {lic['type']} has no DLS"


def test_knn_round_trips(capabilities):
    knn = capabilities["dense_vector + kNN"]
    assert knn.supported, knn.detail
    assert capabilities["_msearch"].supported, "hybrid recall sends BM25 and kNN in one _msearch"


def test_dls_key_sees_only_its_documents(capabilities):
    if load_settings().es_api_key:
        pytest.skip("an API key cannot create API keys with privileges (derived keys have none)")
    dls = capabilities["API key with DLS role descriptor"]
    assert dls.supported, dls.detail


def test_function_score_and_occ_cover_the_missing_scripts(capabilities):
    """Atlas's workaround for the missing script engine needs these two."""
    for name in ("function_score (gauss, field_value_factor, filters)", "partial update with if_seq_no"):
        assert capabilities[name].supported, capabilities[name].detail


def test_doc_rows_parse():
    rows = doc_rows()
    assert len(rows) == len(re.findall(r"^\| ", doc_table(), flags=re.M)) - 1


def test_a_failed_check_is_reported_unsupported(es, monkeypatch):
    """The checks raise `ProbeFailed`, which `python -O` keeps (an `assert` would vanish and pass): the kNN probe,
    answered with the wrong nearest document, is a gap with the check's reason, and the other probes still run."""
    name = "dense_vector + kNN"
    monkeypatch.setattr(caps, "PROBES", [p for p in caps.PROBES if p[0] in {name, "_bulk"}])
    monkeypatch.setattr(es, "search", lambda **kwargs: {"hits": {"hits": [{"_id": "b", "_score": 1.0}]}})
    results = {c.name: c for c in probe(es)}
    assert not results[name].supported
    assert results[name].detail == "kNN returned ['b'] as the nearest document, expected ['a']"
    assert results["_bulk"].supported, results["_bulk"].detail
