"""Causes are declared in one place: every counter row (congestion/counters.py, host and per-path
counters) states the cause family it is evidence of, and a row without one is refused here; a
counter the table does not know is filed under no cause (never link_errors by default); each
cause class is one entry of diagnose/ranking.py CAUSES whose docs section exists."""

import re
from pathlib import Path

import pytest

from collbench.congestion import counters
from collbench.congestion.counters import FAMILIES, TRAFFIC
from collbench.diagnose import evidence
from collbench.diagnose.ranking import CAUSES

DOCS = Path(__file__).resolve().parent.parent / "docs" / "DIAGNOSIS.md"


@pytest.mark.parametrize("row", counters.COUNTERS + counters.PATH_COUNTERS, ids=lambda c: f"{c.source}:{c.name}")
def test_every_counter_row_states_a_cause_family(row):
    assert row.family in FAMILIES, f"{row.source} {row.name}: no cause family (one of {', '.join(FAMILIES)})"


def test_a_counter_the_table_does_not_know_is_filed_under_no_cause():
    for name in ("TCPSackRecovery", "rx_vport_rdma_unicast_packets", "made_up_counter"):
        assert counters.family(name) is None and evidence.family(name) is None, name
    # traffic counters are no evidence of any cause
    assert evidence.family("TCPDelivered") is None and evidence.family("InECT0Pkts") is None
    # a receiver-not-ready NAK is a receive side that cannot keep up, not a bad cable
    assert evidence.family("rnr_nak_retry_err") == counters.PFC


def _anchors(text):
    """GitHub's anchors of a page's headings."""
    out = set()
    for line in text.splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def test_each_cause_is_one_entry_with_its_rule_and_its_docs_section():
    families = set(FAMILIES) - {TRAFFIC}
    assert families <= set(CAUSES), families - set(CAUSES)
    # a family's counters go to its cause's rule, and to no other
    assert {name for name, c in CAUSES.items() if c.from_counters} == families
    anchors = _anchors(DOCS.read_text())
    for name, cause in CAUSES.items():
        assert cause.explanation and (cause.rule is not None or name == evidence.UNEXPLAINED), name
        page, _, anchor = cause.docs.partition("#")
        assert page == "docs/DIAGNOSIS.md" and anchor in anchors, (name, anchor)
