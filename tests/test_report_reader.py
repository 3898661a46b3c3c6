"""The report/baseline results reader: untrusted JSONL in, checked records out, every bad line
counted with its reason and line number, never a crash; directories read as a log and its
rotations; the extra fields of sweep / compare / topo compare checked."""

import json
import os

import pytest

from collbench.errors import UserError
from collbench.report.aggregate import SERIES_FIELDS, Aggregate, series_key
from collbench.results.file_reader import ResultsInput, expand_inputs, parse_since
from collbench.results.record_parser import MAX_LINE_BYTES
from collbench.stats import summarize

GOOD = {"schema": 1, "time": "2026-11-22T15:58:48.140Z", "ts": 1795363128.14, "type": "result",
        "run_id": "20261122T155840-5f78e4e4", "hosts": ["node1", "node2"], "nodes": 2, "ranks": 4,
        "engine": "builtin", "mpi": "mpirun (Open MPI) 4.1.4", "transport": "ucx", "op": "allreduce",
        "datatype": "float", "size": "4MB", "size_bytes": 4194304, "latency_avg_us": 38911.2,
        "latency_min_us": 38870.4, "latency_max_us": 38990.7, "iterations": 500, "warmup": 50,
        "algbw_bytes_per_s": 107791552.1, "busbw_bytes_per_s": 161687328.2, "validation": "off",
        "straggler_rank": 3, "verdict": "Good", "status": "ok"}


def line(**changes):
    rec = dict(GOOD)
    for k, v in changes.items():
        if v is ...:
            rec.pop(k)
        else:
            rec[k] = v
    return json.dumps(rec).encode() + b"\n"


def read(paths, since=None):
    src = ResultsInput([str(p) for p in paths], since=since)
    return list(src), src


def test_every_kind_of_bad_line_is_counted_with_its_reason(tmp_path):
    bad = [
        b"\n",                                          # blank
        b"not json at all\n",
        b"[1,2]\n",
        b'{"schema":1,"type":"result"\n',               # torn
        b"\xff\xfe\xfd\n",                              # not UTF-8
        b'{"a":' + b"[" * 200000 + b"\n",                # nesting bomb
        line(latency_avg_us="fast"),
        line(latency_avg_us=float("inf")).replace(b"Infinity", b"1e999"),
        line(op="allshuffle"),
        line(ranks=...),
        line(hosts="node1"),
        line(size_bytes=10 ** 40),
        line(latency_avg_us=0),                         # no time: cannot sit on a log axis
    ]
    path = tmp_path / "r.jsonl"
    with open(path, "wb") as f:
        f.write(line())
        for b in bad:
            f.write(b)
        f.write(line(op="bcast", size="1MB", size_bytes=1 << 20))
        f.write(b"x" * (MAX_LINE_BYTES + 10) + b"\n")   # oversized: skipped without holding it
        f.write(line(op="reduce", size="1MB", size_bytes=1 << 20))
        f.write(b'{"schema":1,"type":"res')            # last line still being written
    recs, src = read([path])
    assert [r["op"] for r in recs] == ["allreduce", "bcast", "reduce"]
    st = src.stats[0]
    assert st.lines == 1 + len(bad) + 4
    assert st.bad == len(bad) + 2 and st.incomplete_tail
    reasons = " | ".join(st.reasons)
    for text in ("empty line", "not a JSON object", "not UTF-8", "nesting", "latency_avg_us", "op:",
                 "ranks: missing", "hosts:", "integer of N digits", "out of range", "line longer than N bytes",
                 "incomplete last line", "(no time measured)"):
        assert text in reasons, text
    numbers = [n for n, _ in st.examples]
    assert numbers[:3] == [2, 3, 4]                 # line numbers of the first bad lines
    assert all(len(r) < 300 for _, r in st.examples)
    assert "bad line(s) skipped" in src.summary_line()


def test_extra_fields_of_sweep_compare_topo_are_checked(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(line(algorithm="ring", order=[3, 1, 0, 2], pattern="ring", latency_p50_us=38900.0,
                          latency_p90_us=39000.5, latency_p99_us=41000)
                     + line(order={"x": 1}, pattern="recursive_doubling")
                     + line(order="bad\nname", pattern=7)
                     + line(algorithm={"x": 1})                 # documented field: the shared parser rejects
                     + line(latency_p99_us=-1))
    recs, src = read([path])
    assert len(recs) == 3
    assert recs[0]["algorithm"] == "ring" and recs[0]["order"] == "3,1,0,2" and recs[0]["latency_p99_us"] == 41000
    assert "order" not in recs[1] and recs[1]["pattern"] == "recursive_doubling"
    assert "order" not in recs[2] and recs[2]["pattern"] == "7"
    st = src.stats[0]
    assert st.field_problems == 2 and sum(st.field_reasons.values()) == 2 and st.bad == 2
    assert isinstance(recs[0]["hosts"], tuple) and recs[0]["hosts"] is recs[1]["hosts"]


def test_a_directory_is_the_log_and_its_rotations_and_files_are_read_once(tmp_path):
    for name, op in (("results.jsonl", "allreduce"), ("results.jsonl.1", "bcast"), ("results.jsonl.2", "reduce"),
                     ("results.jsonl.10", "allgather"), ("other.jsonl", "alltoall")):
        (tmp_path / name).write_bytes(line(op=op))
    files = expand_inputs([str(tmp_path)])
    assert [os.path.basename(f) for f in files] == ["results.jsonl", "results.jsonl.1", "results.jsonl.2",
                                                    "results.jsonl.10"]
    os.symlink(tmp_path / "results.jsonl", tmp_path / "link.jsonl")
    files = expand_inputs([str(tmp_path), str(tmp_path / "link.jsonl"), str(tmp_path / "results.jsonl.1")])
    assert len(files) == 4
    with pytest.raises(UserError, match="no such file"):
        expand_inputs([str(tmp_path / "nope.jsonl")])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="has no results.jsonl"):
        expand_inputs([str(empty)])


def test_since_filters_and_counts(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(line(ts=1000.0) + line(ts=2000.0) + line(ts=3000.0))
    recs, src = read([path], since=2000.0)
    assert [r["ts"] for r in recs] == [2000.0, 3000.0] and src.stats[0].filtered == 1
    assert parse_since("2h", now=10000.0) == 10000.0 - 7200
    assert parse_since("2026-11-22T15:00:00Z", now=0) == 1795359600.0
    with pytest.raises(UserError):
        parse_since("soon", now=0)


def test_aggregate_medians_stragglers_and_series(tmp_path):
    path = tmp_path / "r.jsonl"
    lats = [100.0, 110.0, 90.0, 300.0, 105.0]
    with open(path, "wb") as f:
        for i, lat in enumerate(lats):
            f.write(line(latency_avg_us=lat, latency_min_us=lat - 5, latency_max_us=lat + 5, ts=1000.0 + i,
                         straggler_rank=3 if i != 2 else 1))
        f.write(line(run_id="other", latency_avg_us=50.0))
    recs, _ = read([path])
    agg = Aggregate()
    for r in recs:
        agg.add(r)
    data = agg.build("run")
    assert len(data.series) == 2
    first = [p for p in data.points if p.series.attrs["run_id"] == GOOD["run_id"]][0]
    assert first.n == 5 and first.latency_avg_us == 105.0 and first.latency_min_us == 100.0
    assert first.stragglers[0] == (3, 4)
    assert data.series[0].label.startswith("run ")
    assert series_key({f: f for f in SERIES_FIELDS}) == SERIES_FIELDS   # written out, kept in step
    merged = agg.build("setup")
    assert len(merged.series) == 1 and merged.points[0].n == 6
    s = summarize(lats)
    assert s["median"] == 105.0 and s["mad"] == 5.0 and s["sigma"] == pytest.approx(7.413)


def test_parallel_reading_equals_serial(tmp_path):
    """Byte ranges read by worker processes give the same records, counts and line numbers."""
    from collbench.baselines.baseline_file import Collector
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as f:
        for i in range(12000):
            f.write(line(ts=1000.0 + i, latency_avg_us=100.0 + i % 97, run_id=f"run{i % 3}"))
            if i % 1000 == 7:
                f.write(b"garbage line\n")
            if i == 6000:
                f.write(b"y" * (MAX_LINE_BYTES + 5) + b"\n")
    assert os.path.getsize(path) > 4 << 20
    results = []
    for workers in (1, 3):
        src = ResultsInput([str(path)])
        agg = src.consume(Aggregate, workers=workers, min_bytes=0)
        data = agg.build("run")
        st = src.stats[0]
        results.append((st.lines, st.bad, dict(st.records), st.examples,
                        sorted((p.series.attrs["run_id"], p.n, p.latency_avg_us) for p in data.points)))
        coll = ResultsInput([str(path)]).consume(Collector, workers=workers, min_bytes=0)
        results[-1] += (sorted(len(v) for v in coll.values.values()),)
    assert results[0] == results[1]
    assert results[0][0] == 12000 + 12 + 1 and results[0][1] == 13
