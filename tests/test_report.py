"""`collbench report`: built from real `collbench once` runs (real mpirun, 2 ranks) and a
stress-log-shaped log written by the daemon's own ResultsLog (with rotations), opened in a real
headless Chromium: no console message, no outside request, a non-blank screenshot, an SVG per
op, no external URL anywhere in the file. Plus PNG and markdown output, the peak sources, the
series that sweep / compare / topo compare records make, and bad input."""

import json
import os
import re
import statistics

import pytest
import yaml

from collbench.report.peak import peak_from_matrix, two_host_config
from collbench.config import load_config
from report_helpers import (collbench, external_urls, non_blank_stats, once_results, read_records, render,
                            signal_at_progress, write_stress_log)

OPS = "allreduce,bcast,allgather,barrier"
GARBAGE = [
    b'{"schema":1,"type":"result","op":"allreduce"',                 # torn line
    b"[1, 2, 3]",                                                   # not an object
    b'{"schema":1,"type":"result","op":"allreduce","size_bytes":"x"}',
    b"\xff\xfe not utf-8",
    b'{"type":"result","latency_avg_us":NaN}',
    b"[" * 5000 + b"]" * 5000,                                      # deep nesting
]


@pytest.fixture(scope="module")
def real_results(tmp_path_factory):
    """Two real `once` runs at 2 ranks in one file (+ garbage lines), and the records."""
    d = tmp_path_factory.mktemp("real")
    path = d / "once.jsonl"
    for _ in range(2):
        once_results(path, "--ops", OPS, "--sizes", "1KB,64KB,1MB", "--iterations", "20")
    records = read_records(path)
    with open(path, "ab") as f:
        for g in GARBAGE:
            f.write(g + b"\n")
    return path, records


def _svg_ids(text):
    return re.findall(r'<svg class="plot" id="fig-([a-z_]+)"', text)


@pytest.mark.mpi
@pytest.mark.slow
def test_report_from_real_runs_and_a_stress_log_in_chromium(real_results, tmp_path):
    once_path, once_records = real_results
    templates = [dict(r) for r in once_records if r["run_id"] == once_records[0]["run_id"]]
    state = tmp_path / "state"
    state.mkdir()
    written = write_stress_log(state / "results.jsonl", templates, iterations=40, rotate_bytes=60000,
                               rotate_keep=10, failure_every=10)
    assert (state / "results.jsonl.1").exists() and (state / "results.jsonl.2").exists()
    out, png, md = tmp_path / "report.html", tmp_path / "png", tmp_path / "table.md"

    p = collbench("report", str(once_path), str(state), "-o", str(out), "--png", str(png), "--markdown", str(md),
                  "--title", "Cluster A after maintenance")
    assert p.returncode == 0, p.stderr
    assert f"{len(GARBAGE)} bad line(s) skipped" in p.stderr
    text = out.read_text(encoding="utf-8")

    # an inline SVG per op, in op-table order; no external reference of any kind
    assert _svg_ids(text) == ["allreduce", "bcast", "allgather", "barrier"]
    assert external_urls(out) == []
    assert "<script" not in text.lower()
    # the stress log's failure error holds a URL: shown, but defused (no "//" in the file)
    assert "www.open-mpi.org" in text
    assert "measured for this report: a two-rank broadcast" in text
    # every series: 2 once runs + the stress log's run
    runs = {r["run_id"] for r in once_records} | {"20261123T000000-5f78e4e4"}
    for run_id in runs:
        assert run_id in text
    assert "4 failure record(s)" in text and "relaunches" in text

    shot = render(out, tmp_path / "shot.png", height=2400)
    assert shot.console == [], shot.console
    assert shot.page_requests == [], shot.page_requests
    colours, share = non_blank_stats(shot.screenshot)
    assert colours > 30 and share > 0.05, (colours, share)

    for op in OPS.split(","):
        c, s = non_blank_stats(png / f"{op}.png")
        assert c > 10 and s > 0.02, (op, c, s)

    # the markdown table: the stress series' busbw at allreduce 1MB is the median of the log's values
    stress_busbw = [r["busbw_bytes_per_s"] for r in _log_records(state)
                    if r.get("type") == "result" and r["op"] == "allreduce" and r["size_bytes"] == 1 << 20]
    assert len(stress_busbw) == 40 and written > 160
    rows = [ln for ln in md.read_text().splitlines() if "20261123T000000-5f78e4e4" in ln and "| allreduce |" in ln
            and "| 1MB " in ln]
    assert len(rows) == 1, rows
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert float(cells[6]) == pytest.approx(statistics.median(stress_busbw) / 1e9, rel=1e-6)
    assert cells[4] == str((1 << 20) // 4)          # float elements
    assert md.read_text().startswith("## Cluster A after maintenance")


def _log_records(state):
    out = []
    for name in sorted(os.listdir(state)):
        with open(state / name, encoding="utf-8") as f:
            out += [json.loads(x) for x in f if x.strip()]
    return out


def test_the_chromium_checks_can_fail(tmp_path):
    """The negative control: a console message and an outside request are caught."""
    page = tmp_path / "bad.html"
    page.write_text('<!doctype html><html><body><h1>x</h1><img src="https://example.invalid/pixel.png">'
                    '<script>console.error("report broke")</script></body></html>')
    shot = render(page, tmp_path / "bad.png", width=400, height=300)
    assert any("report broke" in c for c in shot.console)
    assert any("example.invalid" in u for u in shot.page_requests)
    assert external_urls(page)


def _result(run_id="r1", op="allreduce", size=1 << 20, lat=100.0, ts=1795400000.0, ranks=4, **extra):
    from datetime import datetime, timezone
    n = ranks
    factor = {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n}.get(op, 1.0)
    data = size * n if op == "allgather" else size
    rec = {"schema": 1, "time": datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
           "ts": ts, "type": "result", "run_id": run_id, "hosts": [f"node{i // 2}" for i in range(ranks)],
           "nodes": ranks // 2, "ranks": ranks, "engine": "builtin", "mpi": "mpirun (Open MPI) 4.1.4",
           "transport": "ucx", "op": op, "datatype": "float", "size": _label(size), "size_bytes": size,
           "latency_avg_us": lat, "latency_min_us": lat * 0.9, "latency_max_us": lat * 1.2, "iterations": 100,
           "warmup": 10, "algbw_bytes_per_s": data / lat * 1e6, "busbw_bytes_per_s": data / lat * 1e6 * factor,
           "validation": "off", "straggler_rank": 3, "verdict": None, "status": "ok"}
    rec.update(extra)
    return rec


def _label(size):
    from collbench.sizes import format_size
    return format_size(size)


def _write(path, recs):
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    return path


def test_compare_and_sweep_fields_make_lines_and_p99(tmp_path):
    """compare/topo compare records (algorithm, order) are separate lines labelled by what differs;
    sweep's p99 is drawn dashed and tabled; a bad extra field is dropped and counted."""
    recs = []
    for alg, scale in (("ring", 1.0), ("recursive_doubling", 1.5)):
        for order in ("original", "mapped"):
            for i, size in enumerate((1 << 10, 1 << 16, 1 << 20)):
                lat = (5 + size / 1e3) * scale * (0.8 if order == "mapped" else 1.0)
                recs.append(_result(run_id="cmp1", op="allgather", size=size, lat=lat, ts=1795400000.0 + i,
                                    algorithm=alg, order=order, latency_p50_us=lat, latency_p90_us=lat * 1.3,
                                    latency_p99_us=lat * 2))
    recs.append(_result(run_id="cmp1", op="allgather", size=1 << 10, lat=7.0, algorithm="ring", order={"bad": 1}))
    recs.append(_result(run_id="cmp1", op="allgather", size=1 << 10, lat=7.0, algorithm={"bad": 1}))
    path = _write(tmp_path / "cmp.jsonl", recs)
    out = tmp_path / "r.html"
    p = collbench("report", str(path), "-o", str(out), "--peak-gbps", "12.5")
    assert p.returncode == 0, p.stderr
    assert "1 record(s) with a bad field dropped" in p.stderr and "1 bad line(s) skipped" in p.stderr
    text = out.read_text()
    for label in ("algorithm ring · order original", "algorithm ring · order mapped",
                  "algorithm recursive_doubling · order original", "algorithm recursive_doubling · order mapped"):
        assert label in text, label
    assert "run cmp1" not in text.split("<h2 id=runs>")[0]   # one run: the run id does not tell lines apart
    assert _svg_ids(text) == ["allgather"]
    fig = text[text.index('id="fig-allgather"'):text.index("</svg>", text.index('id="fig-allgather"'))]
    assert fig.count('stroke-dasharray="5 3"') >= 4          # one dashed p99 line per series (+ legend)
    assert "<th>p99</th>" in text
    assert "given with --peak-gbps: 12.5 GB/s" in text


def test_many_runs_group_by_setup(tmp_path):
    """A long stress history with many daemon lives: auto grouping gives one line per setup."""
    recs = [_result(run_id=f"run{i:02d}", ts=1795400000.0 + i * 100, lat=100 + i) for i in range(12)]
    recs += [_result(run_id=f"run{i:02d}", ts=1795400000.0 + i * 100, lat=100 + i, transport="ob1-tcp")
             for i in range(12)]
    path = _write(tmp_path / "many.jsonl", recs)
    out = tmp_path / "r.html"
    p = collbench("report", str(path), "-o", str(out), "--no-peak")
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    assert "one line per setup" in text
    assert "transport ucx" in text and "transport ob1-tcp" in text
    assert "2 series" in p.stderr
    p = collbench("report", str(path), "-o", str(out), "--no-peak", "--group-by", "run")
    assert "24 series" in p.stderr


def test_peak_from_topo_matrix_json_and_csv(tmp_path):
    """topo measure's matrix files (collbench.pair_matrix): the fastest pair at its slower direction."""
    from collbench.pair_matrix import TopoMatrix, save_csv, save_json
    rows = [[None, 10.0, 11.0], [10.0, None, 12.5], [11.0, 12.4, None]]
    m = TopoMatrix.from_rows(["a", "b", "c"], "bandwidth", rows)
    j, c = tmp_path / "bw.json", tmp_path / "bw.csv"
    save_json(str(j), {"bandwidth": m}, meta={"how": "test"})
    save_csv(str(c), m)
    for path in (j, c):
        peak = peak_from_matrix(str(path))
        assert peak.bytes_per_s == pytest.approx(12.4e9) and peak.hosts == ["b", "c"], path
        assert "fastest pair b ↔ c 12.4 GB/s" in peak.text

    results = _write(tmp_path / "r.jsonl", [_result(lat=200.0)])
    out = tmp_path / "r.html"
    p = collbench("report", str(results), "-o", str(out), "--peak-from", str(j))
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    busbw = _result(lat=200.0)["busbw_bytes_per_s"]
    assert f"{100 * busbw / 12.4e9:.0f}%" in text
    assert "from the topo measure matrix bw.json" in text


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    (json.dumps({"hosts": ["a", "b"], "latency_us": [[None, 1], [1, None]]}), "has no bandwidth_GBps matrix"),
    (json.dumps({"hosts": ["a", "b"], "bandwidth_GBps": [[None, "fast"], [1, None]]}), "bandwidth_GBps[0][1]"),
    (json.dumps({"hosts": ["a"], "bandwidth_GBps": [[None]]}), "a matrix needs at least 2"),
    ('{"a":' + "[" * 100000, "JSON"),
])
def test_bad_peak_matrix_is_exit_2(tmp_path, content, message):
    m = tmp_path / "m.json"
    m.write_text(content)
    results = _write(tmp_path / "r.jsonl", [_result()])
    out = tmp_path / "r.html"
    p = collbench("report", str(results), "-o", str(out), "--peak-from", str(m))
    assert p.returncode == 2 and message in p.stderr and str(m) in p.stderr, p.stderr
    assert not out.exists()


def test_bad_input_is_exit_2_and_writes_nothing(tmp_path):
    out = tmp_path / "r.html"
    p = collbench("report", str(tmp_path / "missing.jsonl"), "-o", str(out), "--no-peak")
    assert p.returncode == 2 and "missing.jsonl: no such file" in p.stderr
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(b"garbage\n[1]\n" + b'{"type":"event"}\n')
    p = collbench("report", str(junk), "-o", str(out), "--no-peak")
    assert p.returncode == 2 and "no result or failure records" in p.stderr and "3 bad line(s)" in p.stderr
    p = collbench("report", str(junk), "-o", str(tmp_path / "nodir" / "r.html"), "--no-peak")
    assert p.returncode == 2 and "does not exist" in p.stderr
    p = collbench("report", str(junk), "-o", str(out), "--peak-gbps", "-3")
    assert p.returncode == 2 and "--peak-gbps" in p.stderr
    p = collbench("report", str(junk), "-o", str(out), "--since", "yesterday-ish")
    assert p.returncode == 2 and "--since" in p.stderr
    assert not out.exists()


def test_only_failures_still_make_a_report(tmp_path):
    fail = {k: v for k, v in _result().items() if k in ("schema", "time", "ts", "run_id", "hosts", "nodes", "ranks",
                                                        "engine", "mpi", "transport")}
    fail.update(type="failure", status="failed", error="mpirun: host node1 unreachable", stderr_tail="ssh: timeout",
                op="allreduce", size_bytes=1048576, exit_code=1)
    path = _write(tmp_path / "f.jsonl", [fail, fail])
    out = tmp_path / "r.html"
    p = collbench("report", str(path), "-o", str(out), "--no-peak")
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    assert "2 failure record(s)" in text and "host node1 unreachable" in text and "No result records" in text


def test_two_host_config_spreads_the_peak_ranks(tmp_path):
    cfg = tmp_path / "c.yaml"
    (tmp_path / "engines").mkdir()
    cfg.write_text(yaml.safe_dump({"hosts": ["alpha:4", "beta:4"], "transport": "ob1-tcp",
                                   "engine_path": "engines/collbench-engine"}))
    loaded = two_host_config(load_config(str(cfg)))
    assert loaded.ranks == 2 and loaded.placement() == ["alpha", "beta"]
    assert loaded.engine_path == str(tmp_path / "engines" / "collbench-engine")
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump({"hosts": ["alpha:4"]}))
    assert two_host_config(load_config(str(one))) is None


@pytest.mark.mpi
def test_a_real_sweep_shows_its_percentiles(tmp_path):
    """sweep's records (per-iteration p50/p90/p99) go straight into a report: p99 dashed, tabled."""
    results = tmp_path / "sweep.jsonl"
    p = collbench("sweep", "--np", "2", "--op", "allreduce", "-b", "1KB", "-e", "16KB", "-f", "4", "--iterations",
                  "20", "--results", str(results), "--out-dir", str(tmp_path / "out"), "--quiet", timeout=300)
    assert p.returncode == 0, p.stderr
    p99 = {r["size_bytes"]: r["latency_p99_us"] for r in read_records(results)}
    assert sorted(p99) == [1024, 4096, 16384]
    out = tmp_path / "r.html"
    p = collbench("report", str(results), "-o", str(out), "--peak-gbps", "10")
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    assert "<th>p99</th>" in text and 'stroke-dasharray="5 3"' in text
    from collbench.report.chart import format_us
    for v in p99.values():
        assert f">{format_us(v)}<" in text


@pytest.mark.mpi
def test_the_measured_peak_runs_through_the_harness_and_sigterm_writes_no_report(tmp_path):
    """The peak test runs in the report's process through the harness: its progress on stderr,
    and a SIGTERM during it stops the MPI job, says so, writes nothing and exits 143."""
    import signal
    from collbench import proctree
    path = _write(tmp_path / "r.jsonl", [_result()])
    cfg = tmp_path / "c.yaml"
    cfg.write_text("ranks: 2\ntransport: shm\n")
    out = tmp_path / "r.html"
    code, err, below = signal_at_progress(["report", str(path), "-o", str(out), "--config", str(cfg)], "[1/4] bcast",
                                          signal.SIGTERM)
    assert code == 143, err
    assert "collbench report: terminated after" in err and "no report written" in err
    assert not out.exists()
    assert [p for p in below if proctree.pid_alive(p)] == []
