"""Where people look (issue 20 item 5): the once and sweep tables name the host whose congestion
counters moved most during each step, `stress log` shows it, and `report` has a congestion
section (host x step heat map, the steps' latency beside it) — the CLIs as real processes on a
results log whose records carry the field as the engine builds it (record_field.build). The
same views on real ECN marks: test_congestion_testbed_e2e.py."""

import json
import re
import subprocess
import sys
import time

from conftest import REPO
from test_congestion_views import MARKED_H2, UNMARKED, field

from collbench.congestion import record_field


def _result(op, size_bytes, avg_us, cong=None, seq=1, ts=None):
    from exporter_helpers import result_line
    rec = json.loads(result_line(seq, op=op, size_bytes=size_bytes, avg_us=avg_us, ts=ts or time.time()))
    rec["hosts"], rec["nodes"] = ["h1", "h2", "h3", "h4"], 4
    if cong is not None:
        rec["congestion"] = cong
    return rec


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "collbench", *args], capture_output=True, text=True,
                          cwd=str(REPO), timeout=timeout)


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")


# ----------------------------------------------------------------------- once and sweep tables

def test_once_table_names_the_most_moved_host_only_when_any_moved():
    from collbench.config import Step
    from collbench.once.report_table import render_tables
    steps = [Step("alltoall", 1 << 20, 20, 2, "char"), Step("alltoall", 1 << 16, 20, 2, "char")]
    marked = [_result("alltoall", 1 << 20, 5300.0, field(MARKED_H2)),
              _result("alltoall", 1 << 16, 900.0, field(UNMARKED))]
    lines = render_tables(marked, steps, ranks=4, nodes=4).splitlines()
    assert lines[1].split()[-3:] == ["congested", "(most", "moved)"]
    assert lines[3].endswith("  -")                                          # 64KB: only traffic moved
    assert lines[4].endswith("h2 TCPDeliveredCE=36531")                      # 1MB: h2's egress was marked
    # no step moved a signal (or no record has the field): the table is the one it always was
    quiet = render_tables([_result("alltoall", 1 << 20, 2100.0, field(UNMARKED)),
                           _result("alltoall", 1 << 16, 800.0)], steps, ranks=4, nodes=4)
    assert "congested" not in quiet and quiet.splitlines()[1].split()[-1] == "verdict"


def test_sweep_table_names_the_most_moved_host_and_says_what_the_column_is():
    from collbench.config import Step
    from collbench.sweep.table import render_table
    steps = [Step("allreduce", 1 << 20, 20, 2, "float")]
    rec = _result("allreduce", 1 << 20, 4100.0, field(MARKED_H2))
    rec.update(latency_p50_us=4000.0, latency_p90_us=4200.0, latency_p99_us=4300.0, latency_pmax_us=4400.0)
    text = render_table([rec], steps, 4, 4, "builtin")
    row = [line for line in text.splitlines() if line.strip().startswith("1MB")][0]
    assert row.endswith("h2 TCPDeliveredCE=36531")
    assert "congested: the host whose congestion counters moved most" in text
    quiet = render_table([_result("allreduce", 1 << 20, 4100.0)], steps, 4, 4, "builtin")
    assert "congested" not in quiet


# ----------------------------------------------------------------------------------- stress log

def test_stress_log_shows_the_most_moved_host_and_counts_a_hostile_field(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"state_dir: {state}\n")
    hostile = _result("bcast", 1 << 20, 700.0, dict(field(MARKED_H2), moved={"h2|TCPDeliveredCE@netstat": "9"}), seq=3)
    _write(state / "results.jsonl", [_result("alltoall", 1 << 20, 5300.0, field(MARKED_H2), seq=1),
                                     _result("alltoall", 1 << 16, 900.0, field(UNMARKED), seq=2), hostile])
    r = _run("stress", "log", "--config", str(cfg), "-n", "10")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("congested h2 TCPDeliveredCE=36531") and " alltoall " in lines[0]
    assert "congested" not in lines[1]
    assert "skipped 1 line(s) that are not valid records" in r.stderr and "congestion.moved" in r.stderr


# ---------------------------------------------------------------------------------------- report

def _section(html_text):
    m = re.search(r"<h2 id=congestion>.*?</table></div>((?:<p class=\"note\">.*?</p>)*)", html_text, re.S)
    return m.group(0) if m else None


def test_report_congestion_section_heat_map_with_latency_beside(tmp_path):
    recs = []
    now = time.time() - 600
    for i in range(6):    # 1MB alltoall: h2 marked in 4 of 6 steps, slower then
        cong = field(MARKED_H2) if i < 4 else field(UNMARKED)
        recs.append(_result("alltoall", 1 << 20, 5000.0 if i < 4 else 2000.0, cong, seq=i + 1, ts=now + i))
    recs.append(_result("allreduce", 1 << 16, 300.0, field(UNMARKED), seq=10, ts=now + 10))
    _write(tmp_path / "r.jsonl", recs)
    out = tmp_path / "report.html"
    r = _run("report", str(tmp_path / "r.jsonl"), "-o", str(out), "--no-peak", "--quiet")
    assert r.returncode == 0, r.stderr
    sec = _section(out.read_text(encoding="utf-8"))
    assert sec is not None
    head = re.findall(r"<th>(.*?)</th>", sec)
    assert head[:6] == ["step", "records", "latency (mean)", "signals moved", "latency, signals moved",
                        "latency, none moved"]
    assert head[6:] == ["h2", "h1", "h3", "h4"]       # all moved in 4 records: h2 was the most moved host
    rows = {re.sub(r"<.*?>", "", cells[0]): cells
            for cells in (re.findall(r"<td[^>]*>(.*?)</td>", tr) for tr in re.findall(r"<tr>(.*?)</tr>", sec)) if cells}
    a2a = rows["Alltoall 1MB"]
    assert a2a[1:6] == ["6", "4.00 ms", "4", "5.00 ms", "2.00 ms"]
    assert a2a[6] == "<b>67%</b>"                     # h2: moved in 4 of 6, the most moved host each time
    # h1: its InCEPkts lead; its 45 retransmissions beside 48,125 delivered packets are routine
    assert a2a[7] == "67%" and "leading counter InCEPkts" in sec and "TCPFastRetrans" not in sec
    assert rows["Allreduce 64KB"][3] == "0" and rows["Allreduce 64KB"][6:] == ["·"] * 4
    # a log without the field: no section
    _write(tmp_path / "plain.jsonl", [_result("alltoall", 1 << 20, 2000.0)])
    r = _run("report", str(tmp_path / "plain.jsonl"), "-o", str(tmp_path / "plain.html"), "--no-peak", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "id=congestion" not in (tmp_path / "plain.html").read_text(encoding="utf-8")


def test_report_congestion_section_is_bounded_and_escaped(tmp_path):
    hosts = [f"n{i:04d}" for i in range(1024)] + ["<script>x"]
    moved = {h: {"InCEPkts@netstat": 10 + i} for i, h in enumerate(hosts)}
    cong = field(moved, hosts)
    assert record_field.validate(cong) is None
    recs = [_result("bcast", 1 << k, 100.0 * k, cong, seq=k) for k in range(10, 14)]
    _write(tmp_path / "r.jsonl", recs)
    out = tmp_path / "report.html"
    r = _run("report", str(tmp_path / "r.jsonl"), "-o", str(out), "--no-peak", "--quiet")
    assert r.returncode == 0, r.stderr
    text = out.read_text(encoding="utf-8")
    sec = _section(text)
    assert len(re.findall(r"<th>", sec)) == 6 + 24                     # 24 host columns of 1025
    # each step keeps its 256 most involved hosts (the top one first), the map shows 24 of them
    assert "232 more host(s)" in sec and "3076 less involved host entries left out (at most 256 per step)" in sec
    assert re.findall(r"<th>(.*?)</th>", sec)[6] == "&lt;script&gt;x"
    assert "<script>" not in text and "&lt;script&gt;x" in sec          # the most moved host, escaped


def test_report_section_is_the_same_read_in_parallel_parts(tmp_path):
    """A big log is read by a process per core over byte ranges (results/file_reader.py): the
    parts' congestion maps merge into the one a single reader builds."""
    from collbench.report.aggregate import Aggregate
    from collbench.report.congestion import section
    from collbench.results.file_reader import ResultsInput
    recs = []
    for i in range(400):
        cong = field(MARKED_H2) if i % 3 else field(UNMARKED)
        recs.append(_result(("alltoall", "allreduce")[i % 2], 1 << (16 + i % 5), 1000.0 + i, cong, seq=i + 1))
    _write(tmp_path / "r.jsonl", recs)
    one = ResultsInput([str(tmp_path / "r.jsonl")]).consume(Aggregate, workers=1)
    parts = ResultsInput([str(tmp_path / "r.jsonl")]).consume(Aggregate, workers=4, min_bytes=0)
    assert section(one.congestion) == section(parts.congestion) != ""
    assert sum(st.records for st in parts.congestion.steps.values()) == 400
