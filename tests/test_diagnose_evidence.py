"""`collbench diagnose` names a host or link from counters only when the movement is beyond the
counter's normal by a test that respects counts (congestion/normal.py, diagnose/evidence.py):
against the results' good steps, or the baseline's runs (`baseline save` keeps them) when the
results have too few; a handful of events, or one burst in one step, is never proof, and the
suspect says what it lacks. Per-peer evidence (`congestion.paths`, "<host>><peer>|<counter>")
localizes by the common endpoint. Records are built here in the engine's format; the real-run
side is tests/test_diagnose_lossy_testbed.py."""

import json
import math
import subprocess
import sys

import pytest

import test_diagnose as td
from collbench.congestion.normal import Tally, upper_tail

HOSTS4 = ["h1", "h2", "h3", "h4"]
OPS = [("allreduce", ("256KB", 262144)), ("allreduce", ("1MB", 1048576)), ("alltoall", ("256KB", 262144)),
       ("alltoall", ("1MB", 1048576)), ("allgather", ("256KB", 262144)), ("allgather", ("1MB", 1048576)),
       ("bcast", ("256KB", 262144)), ("bcast", ("1MB", 1048576))]


def once_run(run, factor=1.0, moved_of=None, paths_of=None, base=0):
    """One `once` run on 4 hosts: a step per op and size, latency x factor; moved_of(i) / paths_of(i):
    the moved counters / per-peer counters of step i."""
    out = []
    for i, (op, size) in enumerate(OPS):
        r = td.rec(base + run * 100 + i, 1000.0 * (1 + 0.01 * i) * factor * (1 + 0.005 * run),
                   moved_of(i) if moved_of else {}, hosts=HOSTS4, ranks=4, transport="ob1-tcp", op=op, size=size)
        r["run_id"] = f"20261123T10000{run}-0badcafe"
        if paths_of is not None:
            r["congestion"]["paths"] = paths_of(i)
        out.append(r)
    return out


def save_baseline(tmp_path, records, name="b"):
    quiet = td.write(tmp_path / f"{name}.jsonl", records)
    p = subprocess.run([sys.executable, "-m", "collbench", "baseline", "save", name, "--from", quiet, "--state-dir",
                        str(tmp_path / "state")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p


def diagnose_against(tmp_path, records, name="b", fmt="json"):
    cur = td.write(tmp_path / "cur.jsonl", records)
    p = subprocess.run([sys.executable, "-m", "collbench", "diagnose", cur, "--baseline", name, "--state-dir",
                        str(tmp_path / "state"), "--format", fmt], capture_output=True, text=True, timeout=60)
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, (json.loads(p.stdout) if fmt == "json" else p.stdout)


def named(doc):
    return [s for s in doc["suspects"] if s["host"] or s["link"]]


def test_one_burst_in_one_straying_step_names_no_host_and_says_what_it_lacks(tmp_path):
    """The fresh-clone failure: a `once` run against a baseline strayed past the bound in one step,
    and 504 TCPFastRetrans on one host in that step named it link_errors with no normal."""
    save_baseline(tmp_path, [r for run in range(5) for r in once_run(run)])
    def moved(i):
        return {"h2|TCPFastRetrans@netstat": 504, "h2|TCPDelivered@netstat": 20000} if i == 3 else {}
    cur = once_run(9, moved_of=moved)
    cur[3]["latency_avg_us"] *= 1.6          # the one series that strayed
    rc, doc = diagnose_against(tmp_path, cur)
    assert rc == 1 and len(doc["regressions"]) == 1, doc
    assert named(doc) == [], json.dumps(doc["suspects"])
    (s,) = doc["suspects"]
    assert s["cause"] == "unexplained"
    short = [x for x in s["evidence"]["lacking"] if "TCPFastRetrans" in x]
    assert short and "moved in 1 of 1 slow steps" in short[0], s["evidence"]["lacking"]


def test_a_counter_that_bursts_in_the_baseline_runs_is_weighed_against_its_normal(tmp_path):
    """Every step of the current run is slow (no good steps): the baseline's per-step rates are the
    normal. h2 retransmitted in bursts in the baseline's quiet runs too; h3's errors never moved."""
    def quiet_moved(i):
        return {"h2|TCPFastRetrans@netstat": 400, "h2|TCPDelivered@netstat": 20000} if i % 2 == 0 else {}
    save_baseline(tmp_path, [r for run in range(5) for r in once_run(run, moved_of=quiet_moved)])
    rc, doc = diagnose_against(tmp_path, once_run(9, factor=2.0, moved_of=quiet_moved))
    assert rc == 1 and len(doc["regressions"]) == 8
    assert named(doc) == [], json.dumps(doc["suspects"])       # its bursts are its normal
    lacking = doc["suspects"][0]["evidence"]["lacking"]
    assert any("TCPFastRetrans" in x and "baseline" in x for x in lacking), lacking

    def faulty(i):
        return {**quiet_moved(i), "h3|TCPFastRetrans@netstat": 450, "h3|TCPDelivered@netstat": 20000}
    rc, doc = diagnose_against(tmp_path, once_run(9, factor=2.0, moved_of=faulty))
    top = doc["suspects"][0]
    assert rc == 1 and (top["host"], top["cause"]) == ("h3", "link_errors"), json.dumps(doc["suspects"])
    ev = top["evidence"]["counters"][0]
    assert ev["reference"] == "baseline" and ev["rate_good_per_s"] == 0 and ev["expected"] > 0
    assert 0 <= top["p_value"] < 1e-3 and top["p_value"] == ev["p_value"]
    assert [s["host"] for s in named(doc)] == ["h3"], json.dumps(doc["suspects"])
    # how sure, in the table too
    rc, table = diagnose_against(tmp_path, once_run(9, factor=2.0, moved_of=faulty), fmt="table")
    assert "p (how sure)" in table and "h3" in table


def test_against_a_baseline_the_good_steps_of_the_same_faulty_run_are_no_normal(tmp_path):
    """Half the series of two `once` runs regressed; the others stayed within their bound under the
    same fault (h3 retransmitting in every step): 8 good steps that carry the fault. The
    baseline's quiet runs are the normal (the testbed's lossy host went unnamed otherwise)."""
    save_baseline(tmp_path, [r for run in range(5) for r in once_run(run)])
    lossy = {"h3|TCPFastRetrans@netstat": 450, "h3|TCPDelivered@netstat": 20000}
    cur = once_run(9, moved_of=lambda i: lossy) + once_run(10, moved_of=lambda i: lossy)
    for r in cur:
        if r["op"] in ("allreduce", "alltoall"):
            r["latency_avg_us"] *= 3.0
    rc, doc = diagnose_against(tmp_path, cur)
    assert rc == 1 and len(doc["regressions"]) == 4, doc["regressions"]
    top = doc["suspects"][0]
    assert (top["host"], top["cause"]) == ("h3", "link_errors"), json.dumps(doc["suspects"])
    assert top["evidence"]["counters"][0]["reference"] == "baseline"


def test_a_handful_of_events_in_every_slow_step_is_never_proof(tmp_path):
    save_baseline(tmp_path, [r for run in range(5) for r in once_run(run)])
    rc, doc = diagnose_against(tmp_path, once_run(9, factor=2.0, moved_of=lambda i: {"h4|symbol_error@mlx5_0/1": 2}))
    assert rc == 1 and named(doc) == [], json.dumps(doc["suspects"])
    assert any("16 events (needs 20)" in x for x in doc["suspects"][0]["evidence"]["lacking"])


def test_without_good_steps_or_a_baseline_normal_no_counter_names_a_host(tmp_path):
    """A baseline saved before counter normals existed (no counter_normal) and a run with no good
    steps: nothing to weigh the counters against, so they name nobody, and the suspect says so."""
    save_baseline(tmp_path, [r for run in range(5) for r in once_run(run)])
    path = tmp_path / "state" / "baselines" / "b.json"
    doc = json.loads(path.read_text())
    assert doc["counter_normal"]["exposure"]["host"]["steps"] == 40
    del doc["counter_normal"]
    path.write_text(json.dumps(doc))
    rc, doc = diagnose_against(tmp_path, once_run(9, factor=2.0, moved_of=lambda i: {"h3|TCPDeliveredCE@netstat": 3000}))
    assert rc == 1 and named(doc) == [], json.dumps(doc["suspects"])
    assert any(x.startswith("a normal for the counters") for x in doc["suspects"][0]["evidence"]["lacking"])


@pytest.mark.parametrize("bad", [[1, 2], {"exposure": {"host": {"steps": -1, "seconds": 1, "sum_t2": 1}}, "counters": {}},
                                 {"exposure": {}, "counters": {"no-bar": {}}},
                                 {"exposure": {}, "counters": {"h1|x@y": {"events": "many"}}}])
def test_a_hostile_counter_normal_in_a_baseline_is_exit_2_naming_it(tmp_path, bad):
    save_baseline(tmp_path, [r for run in range(5) for r in once_run(run)])
    path = tmp_path / "state" / "baselines" / "b.json"
    doc = json.loads(path.read_text())
    doc["counter_normal"] = bad
    path.write_text(json.dumps(doc))
    cur = td.write(tmp_path / "cur.jsonl", once_run(9))
    p = subprocess.run([sys.executable, "-m", "collbench", "diagnose", cur, "--baseline", "b", "--state-dir",
                        str(tmp_path / "state")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "counter_normal" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_baseline_save_says_when_it_has_too_few_runs(tmp_path):
    p = save_baseline(tmp_path, [r for run in range(3) for r in once_run(run)])
    assert "fewer than 5 measurements" in p.stderr, p.stderr
    p = save_baseline(tmp_path, [r for run in range(5) for r in once_run(run)], name="five")
    assert "fewer than 5 measurements" not in p.stderr and "counters' normal" not in p.stderr, p.stderr
    # records without counters: the baseline has no counters' normal, and says so
    bare = [r for run in range(5) for r in once_run(run)]
    for r in bare:
        del r["congestion"]
    p = save_baseline(tmp_path, bare, name="bare")
    assert "the counters' normal holds 0 steps" in p.stderr, p.stderr
    assert "counter_normal" not in json.loads((tmp_path / "state" / "baselines" / "bare.json").read_text())


# ---------------------------------------------------------------- per-peer evidence (congestion.paths)

def paths_of(lossy):
    """Every ordered pair of HOSTS4 sends 2000 segments; `lossy` {(host, peer): retransmissions}."""
    def f(i):
        out = {}
        for h in HOSTS4:
            for p in HOSTS4:
                if h != p:
                    out[f"{h}>{p}|tcp_segs_out"] = 2000
                    out[f"{h}>{p}|tcp_retrans_segs"] = lossy.get((h, p), 0)
                    out[f"{h}>{p}|tcp_delivered_ce"] = 0
                    out[f"{h}>{p}|tcp_rtt_us_max"] = 800.0
        return out
    return f


def test_many_lossy_paths_sharing_one_host_name_that_host(tmp_path):
    """A lossy host: its own paths out lose packets, and its dropped ACKs make its peers retransmit
    toward it; the host-wide counters spread over all of them (no host holds half)."""
    save_baseline(tmp_path, [r for run in range(5) for r in once_run(run, paths_of=paths_of({}))])
    lossy = {("h3", "h1"): 60, ("h3", "h2"): 55, ("h3", "h4"): 70, ("h1", "h3"): 40, ("h2", "h3"): 45}
    spread = {f"{h}|TCPFastRetrans@netstat": 100 for h in HOSTS4}
    spread.update({f"{h}|TCPDelivered@netstat": 6000 for h in HOSTS4})
    rc, doc = diagnose_against(tmp_path, once_run(9, factor=3.0, moved_of=lambda i: spread,
                                                  paths_of=paths_of(lossy)))
    top = doc["suspects"][0]
    assert rc == 1 and (top["host"], top["cause"], top["link"]) == ("h3", "link_errors", None), json.dumps(doc["suspects"])
    assert "common endpoint of 5 lossy paths" in top["detail"]
    paths = top["evidence"]["paths"]
    assert {tuple(p["path"]) for p in paths} == set(lossy) and all(p["reference"] == "baseline" for p in paths)
    assert top["p_value"] is not None and top["p_value"] < 1e-3
    assert [s["host"] for s in named(doc)] == ["h3"], json.dumps(doc["suspects"])


def test_one_lossy_path_names_the_link_both_ends(tmp_path):
    save_baseline(tmp_path, [r for run in range(5) for r in once_run(run, paths_of=paths_of({}))])
    rc, doc = diagnose_against(tmp_path, once_run(9, factor=3.0, paths_of=paths_of({("h3", "h2"): 80})))
    top = doc["suspects"][0]
    assert rc == 1 and (top["link"], top["cause"], top["host"]) == (["h3", "h2"], "link_errors", None), \
        json.dumps(doc["suspects"])
    # the ACKs of the same cable lost too: still the one link
    rc, doc = diagnose_against(tmp_path, once_run(9, factor=3.0, paths_of=paths_of({("h3", "h2"): 80, ("h2", "h3"): 30})))
    assert doc["suspects"][0]["link"] == ["h3", "h2"], json.dumps(doc["suspects"])
    # h2's out-of-order arrivals from h3 (receiver side, counted on h2 > h3) outnumber h3's
    # retransmissions, as on the testbed: still the link from h3 to h2
    def ooo(i):
        out = paths_of({("h3", "h2"): 80})(i)
        out["h2>h3|tcp_rcv_ooopack"] = 300
        return out
    rc, doc = diagnose_against(tmp_path, once_run(9, factor=3.0, paths_of=ooo))
    top = doc["suspects"][0]
    assert top["link"] == ["h3", "h2"] and {p["counter"] for p in top["evidence"]["paths"]} == \
        {"tcp_retrans_segs", "tcp_rcv_ooopack"}, json.dumps(doc["suspects"])


def with_dsack(paths_fn, dsack):
    """paths_fn's steps with tcp_dsack_dups on every path: `dsack` {(host, peer): DSACKed segments}."""
    def f(i):
        out = paths_fn(i)
        for h in HOSTS4:
            for p in HOSTS4:
                if h != p:
                    out[f"{h}>{p}|tcp_dsack_dups"] = dsack.get((h, p), 0)
        return out
    return f


def test_retransmissions_the_peer_dsacked_are_no_loss(tmp_path):
    """On a loaded machine quiet runs retransmit hundreds of segments a path, every one DSACKed
    (late ACKs fire tail-loss probes): loss is tcp_retrans_segs less tcp_dsack_dups, in the slow
    steps and in the baseline's normal alike."""
    quiet = {("h3", "h2"): 800}
    save_baseline(tmp_path, [r for run in range(5) for r in once_run(run, paths_of=with_dsack(paths_of({}), {}))])
    rc, doc = diagnose_against(tmp_path, once_run(9, factor=3.0, paths_of=with_dsack(paths_of(quiet), quiet)))
    assert rc == 1 and named(doc) == [], json.dumps(doc["suspects"])
    # the same retransmissions, 100 of them DSACKed: 700 lost a step, the link
    rc, doc = diagnose_against(tmp_path, once_run(9, factor=3.0, paths_of=with_dsack(paths_of(quiet), {("h3", "h2"): 100})))
    top = doc["suspects"][0]
    assert (top["link"], top["cause"]) == (["h3", "h2"], "link_errors"), json.dumps(doc["suspects"])
    (ev,) = [p for p in top["evidence"]["paths"] if p["counter"] == "tcp_retrans_segs"]
    assert ev["delta_slow"] == 8 * 700 and ev["dsack_dups"] == 8 * 100, ev

    # a baseline whose quiet runs retransmitted 600 a step on h3 > h2, all DSACKed: its normal is no
    # loss, so 80 lost a step (680 retransmitted, 600 DSACKed) is beyond it
    spurious = {("h3", "h2"): 600}
    save_baseline(tmp_path, [r for run in range(5) for r in once_run(run, paths_of=with_dsack(paths_of(spurious), spurious))],
                  name="busy")
    rc, doc = diagnose_against(tmp_path, once_run(9, factor=3.0, paths_of=with_dsack(paths_of({("h3", "h2"): 680}), spurious)),
                               name="busy")
    assert (doc["suspects"][0]["link"], doc["suspects"][0]["cause"]) == (["h3", "h2"], "link_errors"), \
        json.dumps(doc["suspects"])


def test_lossy_paths_with_no_common_endpoint_and_routine_loss_name_nobody(tmp_path):
    save_baseline(tmp_path, [r for run in range(5) for r in once_run(run, paths_of=paths_of({}))])
    rc, doc = diagnose_against(tmp_path, once_run(9, factor=3.0, paths_of=paths_of({("h1", "h2"): 60, ("h3", "h4"): 60})))
    assert rc == 1 and named(doc) == [], json.dumps(doc["suspects"])
    # 10 of 2000 segments a step: routine loss recovery, whatever its normal
    rc, doc = diagnose_against(tmp_path, once_run(9, factor=3.0, paths_of=paths_of({("h1", "h2"): 10})))
    assert named(doc) == [] and any("routine loss recovery" in x for x in doc["suspects"][0]["evidence"]["lacking"])
    # h2 received 60 out of order from h1 a step (counted on h2 > h1), of the 100,000 h1 sent it:
    # routine, though h2 itself sent h1 only 2000
    def ooo(i):
        out = paths_of({})(i)
        out["h2>h1|tcp_rcv_ooopack"], out["h1>h2|tcp_segs_out"] = 60, 100000
        return out
    rc, doc = diagnose_against(tmp_path, once_run(9, factor=3.0, paths_of=ooo))
    assert named(doc) == [] and any("h2 > h1's tcp_rcv_ooopack" in x and "of 800000 segments sent" in x
                                    for x in doc["suspects"][0]["evidence"]["lacking"]), json.dumps(doc["suspects"])


def test_paths_from_the_good_steps_of_a_shifted_series(tmp_path):
    """Without a baseline: the shift test's good steps are the paths' normal."""
    recs = td.series(n=60, onset=40, factor=2.0, noise=False, hosts=HOSTS4, ranks=4, transport="ob1-tcp")
    for i, r in enumerate(recs):
        r["congestion"]["paths"] = paths_of({("h2", "h4"): 90} if i >= 40 else {})(i)
    rc, doc, err = td.diagnose(td.write(tmp_path / "r.jsonl", recs))
    top = doc["suspects"][0]
    assert rc == 1 and top["link"] == ["h2", "h4"] and top["cause"] == "link_errors", (err, json.dumps(doc["suspects"]))
    assert top["evidence"]["paths"][0]["reference"] == "good steps"


def test_a_shift_weighs_its_counters_against_the_steps_before_its_onset(tmp_path):
    """The stress loop's lossy link (seed 62 of bench/diagnose_accuracy.py): a fault slows only
    some of the steps it touches (retransmission timeouts), and the good steps after the onset
    carry its loss too. Weighed against every good step the path read as 0.4x normal and only the
    sender was named; against the steps before the onset it names the link."""
    recs = td.series(n=120, onset=60, factor=1.0, hosts=HOSTS4, ranks=4, transport="ob1-tcp")
    for i, r in enumerate(recs):
        fault = i >= 60
        if fault and (i - 60) % 12 < 4:       # a third of its steps slowed, in spells
            r["latency_avg_us"] *= 3.0
        r["congestion"]["paths"] = paths_of({("h2", "h4"): 90} if fault else {})(i)
    rc, doc, err = td.diagnose(td.write(tmp_path / "r.jsonl", recs))
    (reg,) = doc["regressions"]
    assert rc == 1 and reg["slow_steps"] == 20 and reg["normal_steps"] == 60, (err, doc["regressions"])
    top = doc["suspects"][0]
    assert top["link"] == ["h2", "h4"] and top["cause"] == "link_errors", json.dumps(doc["suspects"])
    (ev,) = [p for p in top["evidence"]["paths"] if p["counter"] == "tcp_retrans_segs"]
    assert ev["reference"] == "good steps" and ev["expected"] < 1, ev


def test_a_fault_whose_first_steps_stay_under_the_gate_is_weighed_against_the_steps_before_it(tmp_path):
    """The stress loop's 1 % lossy links (seeds 64 and 67): the loss began 25-80 s before the
    steps that crossed the alert's 2.0x gate, at a milder level (1.2-1.8x) the shift test's reference
    followed. Those steps carried the link's loss, and taken as the normal they made it read as
    0.3-0.4x normal: `unexplained`. The normal ends where the series first left its level, at the
    smallest shift's gate (1.2x)."""
    cfg = tmp_path / "collbench.yaml"
    cfg.write_text(f"state_dir: {tmp_path}\nalerts:\n  shift_ratio: 2.0\n")
    recs = td.series(n=140, onset=40, factor=1.0, hosts=HOSTS4, ranks=4, transport="ob1-tcp")
    for i, r in enumerate(recs):
        r["latency_avg_us"] *= 1.0 if i < 40 else (1.6 if i < 110 else 4.0)
        r["congestion"]["paths"] = paths_of({("h2", "h4"): 90} if i >= 40 else {})(i)
    rc, doc, err = td.diagnose(td.write(tmp_path / "r.jsonl", recs), "--config", cfg)
    (reg,) = doc["regressions"]
    assert rc == 1 and reg["slow_steps"] == 30 and reg["normal_steps"] == 40, (err, doc["regressions"])
    top = doc["suspects"][0]
    assert top["link"] == ["h2", "h4"] and top["cause"] == "link_errors", json.dumps(doc["suspects"])


def test_pooled_series_take_their_normal_before_the_first_departure_too(tmp_path):
    """Two series regressed and a third did not; all three carry a lossy link's loss (in every
    other step) from where the first two left their level. Each regressed series alone moved it
    in 2 of its 4 slow steps (a counter needs 3); pooled (diagnose/verdict.py) they moved it in 4
    of 8, and the third series' steps between the departure and the first slow step, which carry
    the loss too, are no normal either."""
    cfg = tmp_path / "collbench.yaml"
    cfg.write_text(f"state_dir: {tmp_path}\nalerts:\n  shift_ratio: 2.0\n")
    recs = []
    for n, (op, size) in enumerate(OPS[1:4]):
        series = td.series(n=140, onset=40, factor=1.0, hosts=HOSTS4, ranks=4, transport="ob1-tcp", op=op,
                           size=size, seed=n)
        for i, r in enumerate(series):
            if n < 2:
                r["latency_avg_us"] *= 1.0 if i < 40 else (1.6 if i < 136 else 4.0)
            r["congestion"]["paths"] = paths_of({("h2", "h4"): 90} if i >= 40 and i % 2 == 0 else {})(i)
        recs += series
    rc, doc, err = td.diagnose(td.write(tmp_path / "r.jsonl", recs), "--config", cfg)
    assert rc == 1 and [r["slow_steps"] for r in doc["regressions"]] == [4, 4], (err, doc["regressions"])
    assert [r["normal_steps"] for r in doc["regressions"]] == [40, 40], doc["regressions"]
    top = doc["suspects"][0]
    assert top["link"] == ["h2", "h4"] and len(top["regressions"]) == 2, json.dumps(doc["suspects"])


def test_a_path_moving_in_every_slow_step_against_one_burst_in_its_good_steps_names_the_link(tmp_path):
    """The steps view of the count test (congestion/normal.py): one burst of 400 retransmissions in
    60 good steps makes the events view cautious (p 0.02), but moving in 20 of 20 slow steps
    against 1 of 60 is proof. A good step whose per-peer counter read 0 once counted as one it
    moved in, so the path seemed to move in every step of its normal and only the events view was left."""
    recs = td.series(n=80, onset=60, factor=3.0, hosts=HOSTS4, ranks=4, transport="ob1-tcp")
    for i, r in enumerate(recs):
        r["congestion"]["paths"] = paths_of({("h2", "h4"): 90 if i >= 60 else (400 if i == 30 else 0)})(i)
    rc, doc, err = td.diagnose(td.write(tmp_path / "r.jsonl", recs))
    top = doc["suspects"][0]
    assert rc == 1 and top["link"] == ["h2", "h4"], (err, json.dumps(doc["suspects"]))
    (ev,) = [p for p in top["evidence"]["paths"] if p["counter"] == "tcp_retrans_segs"]
    assert ev["p_value"] < 1e-3 and ev["reference"] == "good steps", ev


def test_a_shaped_port_proven_on_one_path_and_losing_on_its_others_names_the_host(tmp_path):
    """The stress loop's shaped link (seeds 64-66: 8 trials of 20): tbf on h3's link drops what
    every peer sends it, but one path alone passed its test and the link to it was named. h3's
    other paths in lost 0.6 % each (short of the 1 % floor alone); pooled they are beyond their
    normal, at 0.4x the proven path's share: h3 is the common endpoint."""
    shaped = {("h4", "h3"): 30} | {(h, "h3"): 12 for h in ("h1", "h2")}
    recs = td.series(n=80, onset=60, factor=3.0, hosts=HOSTS4, ranks=4, transport="ob1-tcp")
    for i, r in enumerate(recs):
        r["congestion"]["paths"] = paths_of(shaped if i >= 60 else {})(i)
    rc, doc, err = td.diagnose(td.write(tmp_path / "r.jsonl", recs))
    top = doc["suspects"][0]
    assert rc == 1 and (top["host"], top["link"], top["cause"]) == ("h3", None, "link_errors"), \
        (err, json.dumps(doc["suspects"]))
    (pool,) = top["evidence"]["pools"]
    assert (pool["host"], pool["direction"], pool["excluded"]) == ("h3", "in", ["h3", "h4"]), pool
    assert pool["p_value"] < 1e-3 and sorted(map(tuple, pool["paths"])) == [("h1", "h3"), ("h2", "h3")], pool
    assert [s["host"] or s["link"] for s in named(doc)] == ["h3"], json.dumps(doc["suspects"])
    # the same steps with their zero counters left out, as the engine writes them: the same verdict
    for r in recs:
        r["congestion"]["paths"] = {k: v for k, v in r["congestion"]["paths"].items() if v}
    rc, same, err = td.diagnose(td.write(tmp_path / "r.jsonl", recs))
    assert same["suspects"][0]["evidence"]["pools"] == [pool] and same["suspects"][0]["host"] == "h3", \
        (err, json.dumps(same["suspects"]))

    # a lossy link's ends: their other paths at their usual few retransmissions, in the good steps
    # too, or losing under a quarter of the link's share: the link, both ends
    for other in (2, 5):
        lossy = {("h4", "h3"): 30} | {(h, "h3"): other for h in ("h1", "h2")}
        for i, r in enumerate(recs):
            r["congestion"]["paths"] = paths_of(lossy if i >= 60 else {} if other == 5 else
                                                {(h, "h3"): other for h in ("h1", "h2")})(i)
        rc, doc, err = td.diagnose(td.write(tmp_path / "r.jsonl", recs))
        top = doc["suspects"][0]
        assert (top["link"], top["host"]) == (["h4", "h3"], None) and top["evidence"]["pools"] == [], \
            (other, err, json.dumps(doc["suspects"]))


def test_records_that_leave_zero_counters_out_weigh_loss_against_every_slow_steps_segments(tmp_path):
    """The engine leaves a per-peer counter at 0 out of the record (congestion/record_field.py).
    A path's loss share is of the segments sent over all the slow steps, not only those its loss
    counter was listed in: 30 of 2000 in every other slow step is 0.75 %, routine, not 1.5 %."""
    recs = td.series(n=80, onset=60, factor=3.0, hosts=HOSTS4, ranks=4, transport="ob1-tcp")
    for i, r in enumerate(recs):
        full = paths_of({("h1", "h2"): 30} if i >= 60 and i % 2 else {})(i)
        r["congestion"]["paths"] = {k: v for k, v in full.items() if v}
    rc, doc, err = td.diagnose(td.write(tmp_path / "r.jsonl", recs))
    assert rc == 1 and named(doc) == [], (err, json.dumps(doc["suspects"]))
    assert any("h1 > h2's tcp_retrans_segs" in x and "300 of 40000 segments sent" in x
               for x in doc["suspects"][0]["evidence"]["lacking"]), json.dumps(doc["suspects"])


LOSSY_HOST_H3 = ({("h3", p): 60 for p in ("h1", "h2", "h4")} | {(p, "h3"): 40 for p in ("h1", "h2", "h4")}
                 | {("h1", "h2"): 40})      # h3's every path, and one beside it (its common-endpoint share 0.9)


def shifted_ops(spec):
    """Series of 80 steps on HOSTS4, 3x slower from step 60, one per (op, lossy paths, host counters
    moved) in spec: the paths {(host, peer): retransmissions} and counters only in the slow steps."""
    recs = []
    for op, lossy, moved in spec:
        series = td.series(n=80, onset=60, factor=3.0, hosts=HOSTS4, ranks=4, transport="ob1-tcp", op=op,
                           slow_moved=moved)
        for i, r in enumerate(series):
            r["congestion"]["paths"] = paths_of(lossy if i >= 60 else {})(i)
        recs += series
    return recs


def test_a_lossy_hosts_ring_link_is_folded_into_the_host(tmp_path):
    """The stress loop's lossy host (seed 64, trial 0): its ring allreduce sends to one neighbour,
    so that regression alone sees one lossy path and names the link; its alltoall sees every path
    of the host. The link is one of the host's lossy paths: the host is the answer, the link goes."""
    recs = shifted_ops([("allreduce", {("h3", "h4"): 90}, None), ("alltoall", LOSSY_HOST_H3, None)])
    rc, doc, err = td.diagnose(td.write(tmp_path / "r.jsonl", recs))
    found = [(s["host"], s["link"], s["cause"]) for s in named(doc)]
    assert rc == 1 and found == [("h3", None, "link_errors")], (err, found)
    assert doc["suspects"][0]["regressions"] == ["allreduce 4MB 4 ranks ob1-tcp", "alltoall 4MB 4 ranks ob1-tcp"]


def test_a_lossy_links_sender_named_from_host_counters_folds_into_the_link(tmp_path):
    """The other way round (seed 62, trial 21): a 3 % lossy link h3 -> h4 named by its paths in
    one regression, and its sender by its host counters alone in another (no lossy path of its
    own there): one fault, the link."""
    recs = shifted_ops([("allreduce", {("h3", "h4"): 90}, None), ("alltoall", {}, {"h3|TCPTimeouts@netstat": 40})])
    rc, doc, err = td.diagnose(td.write(tmp_path / "r.jsonl", recs))
    found = [(s["host"], s["link"], s["cause"]) for s in named(doc)]
    assert rc == 1 and found == [(None, ["h3", "h4"], "link_errors")], (err, found)
    assert doc["suspects"][0]["regressions"] == ["allreduce 4MB 4 ranks ob1-tcp", "alltoall 4MB 4 ranks ob1-tcp"]


def test_a_host_named_from_its_paths_by_one_regression_has_them_when_another_named_it_from_host_counters(tmp_path):
    """The same host named by three regressions: its ring link by allreduce's paths, the host by
    alltoall's paths (common endpoint, score 0.9) and by bcast's host counters alone (score 1.0).
    The merged suspect keeps the best score's evidence, and the paths another regression found:
    without them it read as "named from host counters alone" and was folded into its ring link."""
    recs = shifted_ops([("allreduce", {("h3", "h4"): 90}, None), ("alltoall", LOSSY_HOST_H3, None),
                        ("bcast", {}, {"h3|TCPFastRetrans@netstat": 400})])
    rc, doc, err = td.diagnose(td.write(tmp_path / "r.jsonl", recs))
    found = [(s["host"], s["link"], s["cause"]) for s in named(doc)]
    assert rc == 1 and found == [("h3", None, "link_errors")], (err, found)
    assert len(doc["suspects"][0]["regressions"]) == 3 and doc["suspects"][0]["evidence"]["paths"]


@pytest.mark.parametrize("paths", ["not an object", {"h1|tcp_lost": 3}, {"h1>h1|tcp_lost": 3}, {"h1>h2|tcp_lost": -4},
                                   {"h1>h2|tcp_lost": "7"}, {"h1>h2>h3|tcp_lost": 1}, {"h1>h2|TCP Lost": 1}])
def test_a_malformed_paths_field_is_a_counted_bad_line_never_a_crash(tmp_path, paths):
    recs = td.series(n=60, onset=40, factor=2.0, slow_moved={"h5|TCPDeliveredCE@netstat": 3000})
    recs[45]["congestion"]["paths"] = paths
    rc, doc, err = td.diagnose(td.write(tmp_path / "r.jsonl", recs))
    assert rc == 1 and "Traceback" not in err, err
    assert doc["input"]["bad_lines"] == 1 and doc["suspects"][0]["host"] == "h5", doc["input"]


# ---------------------------------------------------------------- the count test itself

@pytest.mark.parametrize("k,mean,phi,steps", [(5, 2.0, 1.0, 3), (20, 3.0, 0.25, 8), (50, 10.0, 4.0, 8), (30, 1.0, 4.0, 1)])
def test_the_negative_binomial_tail_matches_its_sum(k, mean, phi, steps):
    r = steps / phi
    p = r / (r + mean)
    cdf = sum(math.exp(math.lgamma(j + r) - math.lgamma(r) - math.lgamma(j + 1) + r * math.log(p) + j * math.log1p(-p))
              for j in range(k))
    assert upper_tail(k, mean, phi, steps) == pytest.approx(1 - cdf, rel=1e-6)


def test_a_bursty_normal_needs_more_events_than_a_steady_one():
    steady, bursty = Tally(), Tally()
    for i in range(24):
        steady.add_exposure("host", 0.25)
        bursty.add_exposure("host", 0.25)
        steady.add("h1", "TCPFastRetrans@netstat", 20, 0.25)
        if i % 8 == 0:
            bursty.add("h1", "TCPFastRetrans@netstat", 160, 0.25)
    s, b = steady.reference("h1", "TCPFastRetrans@netstat"), bursty.reference("h1", "TCPFastRetrans@netstat")
    assert s.events == b.events == 480 and s.dispersion == 0 and b.dispersion > 1
    assert upper_tail(400, s.rate * 2.0, s.phi, 8) < 1e-6 < upper_tail(400, b.rate * 2.0, b.phi, 8)
