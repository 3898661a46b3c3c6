"""Results-log lines are untrusted input (issue 9).

A seeded generator writes thousands of hostile lines -- every field x every JSON type, missing
fields, huge/tiny/non-finite numbers, deep nesting, huge strings, invalid UTF-8, broken JSON --
between valid records, into the log of a real exporter (scraped over HTTP) and then through
the real readers (`collbench stress log`, `log -f`, `status`, the daemon's start-up seq scan,
and a real `stress start`). Every valid record is served, every bad line is counted exactly
once, nothing crashes, RSS stays bounded. Plus: the series cap, and /health on a stalled poller.

The expected verdict of each generated line comes from this file's own reading of
docs/LOG_FORMAT.md (ACCEPTS below), not from the validator under test.
Reproduce a failure with the seed it prints: COLLBENCH_FUZZ_SEED=<seed>.
"""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

from collbench.results import records
from collbench.config import load_config
from collbench.exporter.app import Exporter
from collbench.exporter.results_state import ResultsState, series_from_record
from collbench.exporter.server import ExporterHTTPServer
from collbench.results.record_parser import MAX_LINE_BYTES, ParseError, parse_record
from collbench.results.results_log import ResultsLog
from conftest import REPO, wait_for
from exporter_helpers import ExporterProcess, sample

SEED = int(os.environ.get("COLLBENCH_FUZZ_SEED", "20261123"))
CTX = records.RunContext(load_config(None), "builtin", "Open MPI 4.1.4")
RAW = "@@RAW@@"            # placeholder string value replaced by raw JSON text / bytes
BAD_SEQ = 10 ** 12         # the seq hostile lines carry: a reader that took one would jump


# --------------------------------------------------------------------------- the spec

# JSON types each field accepts, per docs/LOG_FORMAT.md ("number" takes ints too).
# (accepted types, required): required is only what readers need ("Shapes readers accept").
COMMON = {"schema": ({"int"}, True), "type": ({"string"}, True), "time": ({"string"}, False),
          "ts": ({"number"}, True), "seq": ({"int"}, False)}
RUN = {"run_id": ({"string"}, False), "hosts": ({"list"}, False), "nodes": ({"int"}, False),
       "ranks": ({"int"}, False), "engine": ({"string"}, False), "mpi": ({"string"}, False),
       "transport": ({"string"}, False)}
ACCEPTS = {
    "result": {**COMMON, **RUN, "nodes": ({"int"}, True), "ranks": ({"int"}, True),
               "op": ({"string"}, True), "datatype": ({"string"}, False), "size": ({"string"}, False),
               "size_bytes": ({"int"}, True), "latency_avg_us": ({"number"}, True),
               "latency_min_us": ({"number", "null"}, False), "latency_max_us": ({"number", "null"}, False),
               "iterations": ({"int"}, False), "warmup": ({"int"}, False),
               "algbw_bytes_per_s": ({"number", "null"}, False), "busbw_bytes_per_s": ({"number", "null"}, False),
               "validation": ({"string"}, False), "straggler_rank": ({"int", "null"}, False),
               "verdict": ({"string", "null"}, False), "status": ({"string"}, False),
               "iteration": ({"int"}, False), "t_start": ({"number"}, False), "t_end": ({"number"}, False)},
    "failure": {**COMMON, **RUN,
                "status": ({"string"}, False), "error": ({"string"}, False), "stderr_tail": ({"string"}, False),
                "op": ({"string", "null"}, False), "size_bytes": ({"int", "null"}, False),
                "exit_code": ({"int", "null"}, False), "iteration": ({"int"}, False)},
    "event": {**COMMON, "event": ({"string"}, True), "pid": ({"int", "null"}, False),
              "detail": ({"string", "null"}, False), "run_id": ({"string", "null"}, False),
              "delay_s": ({"number"}, False), "failures": ({"int"}, False)},
}
SAMPLES = {"null": None, "true": True, "false": False, "int": 7, "float": 2.5, "string": "x",
           "list": ["a"], "object": {"k": 1}}
JSON_TYPE = {"null": "null", "true": "bool", "false": "bool", "int": "int", "float": "number",
             "string": "string", "list": "list", "object": "object"}
BAD_NUMBERS = ["1" + "0" * 400, "-" + "9" * 400, "12345678901234567890123", "1e400", "-1e400",
               "NaN", "Infinity", "-Infinity", "1E999999"]
TINY_NUMBERS = ["1e-400", "5e-324", "0", "0.0", "2.2250738585072014e-308"]
BAD_UTF8 = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\xc0\x80", b"\x80"]
FLOAT_FIELDS_FROM_ZERO = {"result": ["latency_avg_us", "latency_min_us", "latency_max_us", "algbw_bytes_per_s",
                                     "busbw_bytes_per_s", "ts", "t_start"],
                          "failure": ["ts"], "event": ["ts", "delay_s"]}


def accepted(kind, field, sample_name):
    types = ACCEPTS[kind][field][0]
    t = JSON_TYPE[sample_name]
    return t in types or (t == "int" and "number" in types)


def base(kind):
    now = time.time()
    if kind == "result":
        rec = records.result_record(CTX, "allreduce", 4 << 20, "float", 100.0, 90.0, 110.0, 100, 10,
                                    validation="pass", ranks=4, ts=now)
        rec.update(iteration=3, t_start=now - 1, t_end=now)
    elif kind == "failure":
        rec = records.failure_record(CTX, "MPI job exited with code 1", "rank 1 died\n[node:1] more",
                                     op_name="bcast", size_bytes=1024, exit_code=1, ts=now)
        rec["iteration"] = 3
    else:
        rec = records.event_record("backoff", pid=4242, detail="relaunch in 1.0s", ts=now,
                                   run_id=CTX.run_id, delay_s=1.0, failures=1)
    return rec


def dump(rec, raw=None):
    """The record as one line of bytes; the RAW placeholder becomes `raw` (text or bytes)."""
    line = json.dumps(rec, ensure_ascii=False, separators=(",", ":")).encode()
    if raw is not None:
        line = line.replace(json.dumps(RAW).encode(), raw if isinstance(raw, bytes) else raw.encode(), 1)
    assert b"\n" not in line
    return line


class Line:
    """One generated line: `make(seq)` gives its bytes (valid lines take the next seq)."""

    def __init__(self, what, valid, kind, make):
        self.what, self.valid, self.kind, self.make = what, valid, kind, make


def _rec_line(what, valid, kind, mutate, raw=None):
    def make(seq):
        rec = base(kind)
        rec["seq"] = seq
        mutate(rec)
        return dump(rec, raw)
    return Line(what, valid, kind if valid else None, make)


def _set(field, value):
    def mutate(rec):
        rec[field] = value
    return mutate


def _drop(field):
    def mutate(rec):
        del rec[field]
    return mutate


def hostile_catalogue():
    """Every systematic case once: (kind, field) x JSON type, missing fields, bad numbers..."""
    out = []
    for kind, fields in ACCEPTS.items():
        for field, (_types, required) in fields.items():
            for name, value in SAMPLES.items():
                if field == "seq" and name == "int":
                    continue
                ok = accepted(kind, field, name)
                if ok and name in ("int", "string"):
                    continue   # a value of the right type: range and enum checks come below
                if ok and name == "null":
                    out.append(_rec_line(f"{kind}.{field}=null", True, kind, _set(field, None)))
                    continue
                if ok and name == "float":
                    continue
                if ok:
                    continue
                out.append(_rec_line(f"{kind}.{field}={name}", False, kind, _set(field, value)))
            if required:
                out.append(_rec_line(f"{kind}.{field} missing", False, kind, _drop(field)))
            if ACCEPTS[kind][field][0] & {"int", "number"}:
                for num in BAD_NUMBERS:
                    out.append(_rec_line(f"{kind}.{field}={num[:12]}", False, kind, _set(field, RAW), raw=num))
        for field in FLOAT_FIELDS_FROM_ZERO[kind]:
            for num in TINY_NUMBERS:
                out.append(_rec_line(f"{kind}.{field}={num}", True, kind, _set(field, RAW), raw=num))
        for i, bad in enumerate(BAD_UTF8):
            out.append(_rec_line(f"{kind} utf8 {i}", False, kind, _set("run_id" if kind != "event" else "detail", RAW),
                                 raw=b'"ab' + bad + b'cd"'))
        out.append(_rec_line(f"{kind} lone surrogate", False, kind, _set("x_note", RAW), raw='"a\\ud800b"'))
        out.append(_rec_line(f"{kind} surrogate pair", True, kind, _set("x_note", RAW), raw='"a\\ud83d\\ude00b"'))
        out.append(_rec_line(f"{kind} unicode", True, kind, _set("x_note", "héllo ☃ ∑ 字")))
        out.append(_rec_line(f"{kind} extra nested", True, kind, _set("x_future", {"a": [1, {"b": [None, 2.5]}]})))
        out.append(_rec_line(f"{kind} extra big", True, kind, _set("x_big", "y" * 300_000)))
        out.append(_rec_line(f"{kind} deep 200000", False, kind, _set("x_deep", RAW),
                             raw="[" * 200_000 + "]" * 200_000))
        out.append(_rec_line(f"{kind} deep open", False, kind, _set("x_deep", RAW), raw="[" * 200_000))
        out.append(_rec_line(f"{kind} deep 70", False, kind, _set("x_deep", RAW), raw="[" * 70 + "]" * 70))
        out.append(_rec_line(f"{kind} wide", False, kind, _set("x_wide", RAW), raw="[" + ",".join(["{}"] * 100) + "]"))
        out.append(_rec_line(f"{kind} over-long", False, kind, _set("x_big", "z" * (MAX_LINE_BYTES + 10))))
        out.append(_rec_line(f"{kind} huge run_id", False, kind, _set("run_id", "r" * 200_000)))
        out.append(_rec_line(f"{kind} control char", False, kind, _set("x_note", RAW), raw=b'"a\x1bb"'))
        out.append(_rec_line(f"{kind} nul", False, kind, _set("x_note", RAW), raw=b'"a\x00b"'))
        out.append(_rec_line(f"{kind} dup key", False, kind, _set("type", RAW), raw=f'"{kind}","type":"{kind}"'))
        out.append(_rec_line(f"{kind} schema 2", False, kind, _set("schema", 2)))
        out.append(_rec_line(f"{kind} bad time", False, kind, _set("time", "yesterday")))
        out.append(_rec_line(f"{kind} ts future", False, kind, _set("ts", 1e20)))
        out.append(_rec_line(f"{kind} ts negative", False, kind, _set("ts", -5)))
        out.append(_rec_line(f"{kind} seq 0", False, kind, _set("seq", 0)))
        out.append(_rec_line(f"{kind} seq 2**60", False, kind, _set("seq", 1 << 60)))
    out += [
        _rec_line("type unknown", False, "event", _set("type", "checkpoint")),
        _rec_line("op unknown", False, "result", _set("op", "allsing")),
        _rec_line("op list", False, "result", _set("op", ["allreduce"])),
        _rec_line("size mismatch", False, "result", _set("size", "5MB")),
        _rec_line("barrier with bytes", False, "result", lambda r: r.update(op="barrier", size="-", size_bytes=8)),
        _rec_line("nodes 0", False, "result", _set("nodes", 0)),
        _rec_line("ranks negative", False, "result", _set("ranks", -4)),
        _rec_line("latency negative", False, "result", _set("latency_avg_us", -1.0)),
        _rec_line("hosts of ints", False, "result", _set("hosts", [1, 2])),
        _rec_line("hosts nested", False, "failure", _set("hosts", [["a"]])),
        _rec_line("verdict lower", False, "result", _set("verdict", "good")),
        _rec_line("validation bool", False, "result", _set("validation", True)),
        _rec_line("event name", False, "event", _set("event", "Bad Name!")),
        _rec_line("mpi 300KB", False, "result", _set("mpi", "m" * 300_000)),
        _rec_line("error 100KB", False, "failure", _set("error", "e" * 100_000)),
        _rec_line("exit code 2**40", False, "failure", _set("exit_code", 1 << 40)),
        _rec_line("event unknown name", True, "event", _set("event", "log_reopened")),
        _rec_line("barrier", True, "result", lambda r: r.update(op="barrier", size="-", size_bytes=0,
                                                                algbw_bytes_per_s=None, busbw_bytes_per_s=None)),
        _rec_line("failure op null", True, "failure", lambda r: r.update(op=None, size_bytes=None, exit_code=None)),
    ]
    for text in [b"", b"   ", b"[]", b"1", b'"record"', b"null", b"{", b"}", b'{"type":"result"', b"\xef\xbb\xbf{}",
                 b"[" * 200_000, b"{" * 200_000, b'{"a":' * 100_000, b'"\\"' * 50_000 + b"[" * 1000]:
        out.append(Line(f"raw {text[:12]!r}", False, None, lambda seq, t=text: t))
    return out


def random_bad(rng, small_bad):
    """More hostile lines: a torn valid record, binary junk, or a (small) catalogue case again."""
    r = rng.random()
    if r < 0.25:
        kind = rng.choice(list(ACCEPTS))

        def torn(seq, kind=kind, frac=rng.random()):
            full = dump(dict(base(kind), seq=BAD_SEQ))
            return full[:int(len(full) * frac)]   # never the closing brace: not JSON
        return Line("torn", False, None, torn)
    if r < 0.4:
        junk = bytes(rng.choice(range(256)) for _ in range(rng.randint(1, 300))).replace(b"\n", b" ")
        return Line("junk", False, None, lambda seq, j=junk: j)
    return rng.choice(small_bad)


def batch(rng, catalogue, n_random, sentinel_sizes):
    """[Line]: a sentinel result, the catalogue and n_random more, shuffled with valid records,
    then another sentinel."""
    small_bad = [x for x in catalogue if not x.valid and len(x.make(BAD_SEQ)) < 50_000]
    body = list(catalogue) + [random_bad(rng, small_bad) for _ in range(n_random)]
    body += [_rec_line("plain", True, rng.choice(list(ACCEPTS)), lambda r: None) for _ in range(n_random // 5)]
    rng.shuffle(body)
    first, last = (_rec_line(f"sentinel {s}", True, "result",
                             lambda r, s=s: r.update(op="alltoall", size_bytes=s, size=records.format_size(s),
                                                     latency_avg_us=s / 1000.0)) for s in sentinel_sizes)
    return [first] + body + [last]


def render(lines, next_seq):
    """(bytes of the lines, valid seqs, {type: valid count}, bad count, next seq)."""
    out, seqs, counts, bad = [], [], {"result": 0, "failure": 0, "event": 0}, 0
    for ln in lines:
        if ln.valid:
            out.append(ln.make(next_seq))
            seqs.append(next_seq)
            counts[ln.kind] += 1
            next_seq += 1
        else:
            out.append(ln.make(BAD_SEQ))
            bad += 1
    return b"\n".join(out) + b"\n", seqs, counts, bad, next_seq


def append_bytes(path, data, rng):
    """Append in random pieces, flushed: readers see partial lines too."""
    with open(path, "ab") as f:
        pos = 0
        while pos < len(data):
            n = rng.randint(1, 256 * 1024)
            f.write(data[pos:pos + n])
            f.flush()
            pos += n


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def run_measured(argv, timeout=120):
    """Run argv; (returncode, stdout, stderr, max RSS in KB) of that one child."""
    import tempfile
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(argv, stdout=out, stderr=err, cwd=str(REPO))
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                raise AssertionError(f"{argv} did not finish in {timeout}s")
            time.sleep(0.05)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read().decode(), err.read().decode(), usage.ru_maxrss


def _has_open(pid, path):
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            pass
    return False


def stress_cmd(verb, state_dir, *extra):
    return [sys.executable, "-m", "collbench", "stress", verb, "--state-dir", str(state_dir), *extra]


# --------------------------------------------------------------------------- the validator alone

def test_catalogue_verdicts_match_the_spec():
    """Each systematic case gets the verdict the spec gives it (a fast, exact failure message)."""
    wrong = []
    for ln in hostile_catalogue():
        got = parse_record(ln.make(5 if ln.valid else BAD_SEQ))
        if isinstance(got, ParseError) == ln.valid:
            wrong.append((ln.what, got))
    assert not wrong, wrong[:20]
    assert len(hostile_catalogue()) > 400


def test_the_daemons_own_records_are_valid():
    for kind in ACCEPTS:
        rec = base(kind)
        rec["seq"] = 1
        got = parse_record(records.dumps(rec) + "\n")
        assert not isinstance(got, ParseError), (kind, got)
        assert got == json.loads(records.dumps(rec))
    osu = records.result_record(CTX, "bcast", 1024, "char", 5.0, None, None, 100, 10)   # OSU without -f
    assert series_from_record(parse_record(records.dumps(osu))).min_s == 5e-6


# --------------------------------------------------------------------------- the property test

@pytest.mark.slow
def test_hostile_lines_between_valid_ones(tmp_path, free_port):
    rng = random.Random(SEED)
    print(f"COLLBENCH_FUZZ_SEED={SEED}")
    catalogue = hostile_catalogue()
    state = tmp_path / "state"
    state.mkdir()
    log = state / "results.jsonl"
    before = render([_rec_line("before", True, "result",
                               lambda r: r.update(size_bytes=1 << 20, size="1MB", latency_avg_us=77.0))], 1)
    log.write_bytes(before[0])
    next_seq = before[4]
    all_seqs = list(before[1])
    total_bad = 0
    with ExporterProcess(["--results-log", str(log), "--state-dir", str(state), "--collectors", "results",
                          "--poll-interval", "0.05", "--legacy-metrics"], free_port) as ex:
        ex.wait_ready(timeout=30)
        assert sample(ex.metrics(), "collbench_latency_avg_seconds", op="allreduce", size="1MB",
                      size_bytes=1 << 20, nodes=1, ranks=4) == pytest.approx(77e-6)
        counted = {"result": 0, "failure": 0, "event": 0}
        rss = []
        follower = None
        for rnd in range(2):
            if rnd == 1:   # `stress log -f` follows the second round as it is written
                follow_out = open(tmp_path / "follow.out", "w+")
                follow_err = open(tmp_path / "follow.err", "w+")
                follower = subprocess.Popen(stress_cmd("log", state, "-f", "--json", "--lines", "0"),
                                            stdout=follow_out, stderr=follow_err, cwd=str(REPO))
                # it starts at the end of the log: wait until it has the log open
                assert wait_for(lambda: _has_open(follower.pid, log), timeout=30), follow_err.read()
            sizes = ((2 * rnd + 3) << 20, (2 * rnd + 4) << 20)
            lines = batch(rng, catalogue, 1200, sizes)
            data, seqs, counts, bad, next_seq = render(lines, next_seq)
            append_bytes(log, data, rng)
            all_seqs += seqs
            total_bad += bad
            for t in counted:
                counted[t] += counts[t]

            def caught_up():
                m = ex.metrics()
                got = {t: sample(m, "collbench_results_records_total", type=t) for t in counted}
                return m if got == counted else None
            m = wait_for(caught_up, timeout=60, interval=0.2)
            assert m, f"seed {SEED}: records never reached {counted}: {ex.metrics()}"
            # every bad line counted exactly once; the poller never hit an internal error
            assert sample(m, "collbench_results_parse_errors_total") == total_bad, f"seed {SEED}"
            assert sample(m, "collbench_exporter_poll_errors_total") == 0
            for s in sizes:     # the valid records right before and after the garbage are served
                assert sample(m, "collbench_latency_avg_seconds", op="alltoall", size=records.format_size(s),
                              size_bytes=s, nodes=1, ranks=4) == pytest.approx(s / 1000.0 / 1e6)
                assert sample(m, "mpi_alltoall_latency_us", size=records.format_size(s), nodes=1) == \
                    pytest.approx(s / 1000.0)
            assert sample(m, "collbench_latency_avg_seconds", op="allreduce", size="1MB",
                          size_bytes=1 << 20, nodes=1, ranks=4) == pytest.approx(77e-6)
            status, _, body = ex.get("/health")
            assert status == 200 and json.loads(body)["reason"] is None
            rss.append(rss_kb(ex.proc.pid))
            round_bad, round_seqs = bad, seqs
        assert ex.proc.poll() is None
        # the same hostile load again does not grow the exporter (no leak, nothing kept per line)
        assert rss[1] - rss[0] < 30 * 1024, f"RSS grew from {rss[0]} to {rss[1]} KB"
        assert rss[1] < 300 * 1024

        # `stress log -f` saw the second round: each valid record once, each bad line counted
        def followed_seqs():
            # whole lines only (the follower may be mid-write); a substring test could match a
            # timestamp's digits and stop waiting early
            text = open(tmp_path / "follow.out").read()
            return [json.loads(x)["seq"] for x in text[:text.rfind("\n") + 1].splitlines()]
        assert wait_for(lambda: round_seqs[-1] in followed_seqs(), timeout=30), \
            open(tmp_path / "follow.err").read()
        follower.send_signal(signal.SIGINT)
        follower.wait(timeout=20)
        followed = [json.loads(x)["seq"] for x in open(tmp_path / "follow.out").read().splitlines()]
        assert followed == round_seqs
        err = open(tmp_path / "follow.err").read()
        assert f"skipped {round_bad} line(s)" in err and "Traceback" not in err, err[-2000:]
        follow_out.close()
        follow_err.close()

    # `stress log`: every valid record of the log, in order; every bad line counted once
    rc, out, err, maxrss = run_measured(stress_cmd("log", state, "--json", "--lines", "1000000"))
    assert rc == 0, err[-2000:]
    assert [json.loads(x)["seq"] for x in out.splitlines()] == all_seqs
    assert f"skipped {total_bad} line(s)" in err and "Traceback" not in err, err[-2000:]
    assert maxrss < 400 * 1024, maxrss
    rc, out, err, _ = run_measured(stress_cmd("log", state, "--lines", "50"))
    assert rc == 0 and "Traceback" not in err and len(out.splitlines()) == 50

    # `stress status`: no crash, the newest results, the bad lines counted
    rc, out, err, maxrss = run_measured(stress_cmd("status", state, "--json"))
    assert rc == 3, err[-2000:]          # stopped (LSB), and not a traceback
    st = json.loads(out)
    assert st["bad_lines"]["count"] == total_bad
    assert {(r["op"], r["size_bytes"]) for r in st["last_results"]} >= {("alltoall", 6 << 20), ("allreduce", 1 << 20)}
    rc, out, err, _ = run_measured(stress_cmd("status", state))
    assert rc == 3 and f"{total_bad} line(s)" in out and "Traceback" not in err, out + err

    # the exporter's start-up read (backfill) over the hostile tail: starts, recovers, counts nothing
    with ExporterProcess(["--results-log", str(log), "--state-dir", str(state), "--collectors", "results"],
                         free_port) as ex:
        ex.wait_ready(timeout=30)
        m = ex.metrics()
        assert sample(m, "collbench_latency_avg_seconds", op="alltoall", size="6MB", size_bytes=6 << 20,
                      nodes=1, ranks=4) == pytest.approx((6 << 20) / 1000.0 / 1e6)
        assert sample(m, "collbench_results_parse_errors_total") == 0
        assert sample(m, "collbench_exporter_poll_errors_total") == 0

    # the daemon's start-up seq scan: past a burst of garbage bigger than its first window
    garbage = b"".join(dump(dict(base("result"), seq=BAD_SEQ, op=["allreduce"])) + b"\n" for _ in range(600))
    assert len(garbage) > 300_000
    append_bytes(log, garbage, rng)
    with ResultsLog(str(log), rotate_bytes=0, rotate_keep=3) as rl:
        assert rl.last_seq == all_seqs[-1]


@pytest.mark.mpi
@pytest.mark.slow
def test_real_daemon_starts_on_a_hostile_log_and_continues_the_seq(tmp_path):
    """The crash loop of issue 9: `stress start` on a log whose tail is hostile starts, and its
    first record continues after the last valid seq."""
    from stress_helpers import Stress, write_config
    rng = random.Random(SEED + 1)
    s = Stress(write_config(tmp_path), tmp_path / "state")
    s.state_dir.mkdir()
    catalogue = hostile_catalogue()
    data, seqs, _, _, _ = render(batch(rng, catalogue, 200, (1 << 20, 2 << 20)), 1)
    s.results.write_bytes(data + b"".join(ln.make(BAD_SEQ) + b"\n" for ln in catalogue if not ln.valid))
    try:
        s.start()
        first = s.wait_for(lambda recs: [r for r in recs if r["type"] == "event" and r["event"] == "start"],
                           timeout=90, what="the daemon's start event")
        assert first[0]["seq"] == seqs[-1] + 1
        r = s.run("status")
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    finally:
        s.cleanup()


# --------------------------------------------------------------------------- series cap

@pytest.mark.slow
def test_series_cap_bounds_memory_and_counts_dropped(tmp_path, free_port):
    log = tmp_path / "results.jsonl"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("exporter:\n  max_series: 1000\n  collectors: [results]\n")
    now = time.time()
    n = 20_000     # bench/exporter_series_cap.py measures 50,000 against no cap
    one = records.result_record(CTX, "allreduce", 4, "float", 10.0, None, None, 10, 1, ranks=4, ts=now)
    with open(log, "w") as f:
        for i in range(n):     # n distinct sizes
            size = 4 * (i + 1)
            f.write(records.dumps(dict(one, size_bytes=size, size=records.format_size(size),
                                       latency_avg_us=10.0 + i, seq=i + 1)) + "\n")
    with ExporterProcess(["--config", str(cfg), "--results-log", str(tmp_path / "live.jsonl"),
                          "--state-dir", str(tmp_path), "--poll-interval", "0.1"], free_port) as ex:
        ex.wait_ready(timeout=30)
        rss0 = rss_kb(ex.proc.pid)
        os.rename(log, tmp_path / "live.jsonl")     # appears whole: read by the tailer, counted
        m = wait_for(lambda: (lambda m: m if sample(m, "collbench_results_records_total", type="result") == n
                              else None)(ex.metrics()), timeout=90, interval=1.0)
        assert m, "the records were not all read"
        kept = [k for k in m if k[0] == "collbench_latency_avg_seconds"]
        assert len(kept) == 1000
        assert sample(m, "collbench_exporter_series_dropped_total") == n - 1000
        # the first 1000 series are kept (new ones are dropped, existing ones keep updating)
        assert {dict(k[1])["size_bytes"] for k in kept} == {str(4 * (i + 1)) for i in range(1000)}
        assert rss_kb(ex.proc.pid) - rss0 < 60 * 1024
        # existing series still update while the table is full
        with open(tmp_path / "live.jsonl", "a") as f:
            rec = records.result_record(CTX, "allreduce", 4, "float", 1.5, None, None, 10, 1, ranks=4,
                                        ts=time.time())
            f.write(records.dumps(rec) + "\n")
        assert wait_for(lambda: sample(ex.metrics(), "collbench_latency_avg_seconds", op="allreduce", size="4B",
                                       size_bytes=4, nodes=1, ranks=4) == pytest.approx(1.5e-6), timeout=20)


def test_series_cap_frees_slots_as_series_go_stale():
    now = [1_000_000.0]
    st = ResultsState(max_age=60, clock=lambda: now[0], max_series=3)

    def line(size, ts):
        return records.dumps(records.result_record(CTX, "bcast", size, "float", 5.0, None, None, 10, 1, ts=ts))
    for size in (1024, 2048, 4096, 8192):
        st.ingest(line(size, now[0]))
    assert sorted(s.size_bytes for s in st.fresh_series()) == [1024, 2048, 4096]
    assert st.snapshot()["series_dropped"] == 1
    st.ingest(line(1024, now[0]))          # a known series still updates
    assert st.snapshot()["series_dropped"] == 1
    now[0] += 120                          # all stale: their slots free up
    st.ingest(line(16384, now[0]))
    assert [s.size_bytes for s in st.fresh_series()] == [16384]
    assert st.snapshot()["series_dropped"] == 1


def test_config_rejects_a_bad_max_series(tmp_path):
    cfg = tmp_path / "c.yaml"
    for bad in ("0", "many"):
        cfg.write_text(f"exporter:\n  max_series: {bad}\n")
        r = subprocess.run([sys.executable, "-m", "collbench", "exporter", "--config", str(cfg)],
                           capture_output=True, text=True, timeout=60, cwd=str(REPO))
        assert r.returncode == 2 and "exporter.max_series" in r.stderr, (bad, r.stderr)
    r = subprocess.run([sys.executable, "-m", "collbench", "exporter", "--max-series", "0", "--results-log",
                        str(tmp_path / "r.jsonl")], capture_output=True, text=True, timeout=60, cwd=str(REPO))
    assert r.returncode == 2 and "--max-series: got 0" in r.stderr, r.stderr


# --------------------------------------------------------------------------- health

def _health(url):
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except OSError:          # not listening yet
        return None, {}


def _exporter_in_process(tmp_path, log, poll_interval):
    """(Exporter, its HTTP server serving on a free loopback port, the URL): results only, a 1 s
    stall limit (10 s in a real exporter); the caller starts the exporter and shuts both down."""
    settings = SimpleNamespace(results_log=str(log), state_dir=str(tmp_path), max_age=900.0,
                               poll_interval=poll_interval, legacy_metrics=False, collectors=["results"],
                               sysfs_root="/sys", procfs_root="/proc", ethtool="ethtool", netdevs=None,
                               device_include=None, device_exclude=None, stall_seconds=1.0)
    ex = Exporter(settings)
    server = ExporterHTTPServer(("127.0.0.1", 0), ex)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    return ex, server, f"http://127.0.0.1:{server.port}"


@pytest.mark.slow
def test_health_reports_a_poller_that_cannot_read_and_recovers(tmp_path, caplog):
    """A FIFO put in place of the log (it used to block the poller in open(2) for good): polls
    fail and are counted, /metrics keeps answering, /health says why once the stall limit has
    passed; a regular file again and all is well. The exporter in this process, its stall limit
    1 s (10 s in a real one: only the wait would differ)."""
    from exporter_helpers import parse_exposition
    log = tmp_path / "results.jsonl"
    log.write_text(records.dumps(dict(base("event"), seq=1)) + "\n")
    ex, server, url = _exporter_in_process(tmp_path, log, poll_interval=0.2)

    def metrics():
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            return parse_exposition(r.read().decode())
    try:
        ex.start()
        assert wait_for(lambda: _health(url)[0] == 200, timeout=10)
        os.unlink(log)
        os.mkfifo(log)
        got = wait_for(lambda: (lambda h: h if h[0] == 503 else None)(_health(url)), timeout=20, interval=0.2)
        assert got, _health(url)
        reason = got[1]["reason"]
        assert "no poll of the results log has completed for" in reason and "not a regular file" in reason, reason
        assert got[1]["poll_errors"] > 0
        assert sample(metrics(), "collbench_exporter_poll_errors_total") > 0
        os.unlink(log)
        log.write_text(records.dumps(dict(base("result"), seq=2)) + "\n")
        assert wait_for(lambda: _health(url)[0] == 200, timeout=20)
        assert wait_for(lambda: sample(metrics(), "collbench_results_records_total", type="result") == 1,
                        timeout=20)
    finally:
        server.shutdown()
        server.server_close()
        ex.stop()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "not a regular file" in logged and "Traceback" not in caplog.text, logged[-3000:]


def test_health_reports_a_stalled_poller_then_its_recovery(tmp_path):
    """The poller thread blocked (here: on the state lock a test thread holds, as a stuck
    filesystem would block a read): /health turns 503 with the reason, and back to 200."""
    log = tmp_path / "results.jsonl"
    log.write_text(records.dumps(dict(base("result"), seq=1)) + "\n")
    ex, server, url = _exporter_in_process(tmp_path, log, poll_interval=0.05)
    try:
        ex.start()
        assert wait_for(lambda: _health(url)[0] == 200, timeout=10)
        with ex.state._lock:                       # the poller blocks at its next record
            with open(log, "a") as f:
                f.write(records.dumps(dict(base("event"), seq=2)) + "\n")
            got = wait_for(lambda: (lambda h: h if h[0] == 503 else None)(_health(url)), timeout=20)
            assert got and "no poll of the results log has completed" in got[1]["reason"], got
            assert got[1]["status"] == "unhealthy"
        assert wait_for(lambda: _health(url)[0] == 200, timeout=10)
        assert ex.state.snapshot()["records"]["event"] == 1
    finally:
        server.shutdown()
        server.server_close()
        ex.stop()


def test_poller_survives_an_internal_error_and_counts_it(tmp_path):
    """A fault inside the poll (here a tailer whose file descriptor was closed under it, EBADF)
    is counted and logged; the thread goes on and recovers on the next poll."""
    log = tmp_path / "results.jsonl"
    log.write_text("")
    settings = SimpleNamespace(results_log=str(log), state_dir=str(tmp_path), max_age=900.0, poll_interval=0.05,
                               legacy_metrics=False, collectors=["results"], sysfs_root="/sys",
                               procfs_root="/proc", ethtool="ethtool", netdevs=None, device_include=None,
                               device_exclude=None)
    ex = Exporter(settings)
    ex.start()
    try:
        assert wait_for(lambda: ex.last_poll is not None, timeout=10)
        ex.tailer._fd, real = 10 ** 6, ex.tailer._fd    # a descriptor that does not exist
        assert wait_for(lambda: ex.state.snapshot()["poll_errors"] > 0, timeout=10)
        assert ex._thread.is_alive()
        ex.tailer._fd = real
        with open(log, "a") as f:
            f.write(records.dumps(dict(base("result"), seq=1)) + "\n")
        assert wait_for(lambda: ex.state.snapshot()["records"]["result"] == 1, timeout=10)
        assert wait_for(lambda: ex.health()[0], timeout=10), ex.health()
    finally:
        ex.stop()
