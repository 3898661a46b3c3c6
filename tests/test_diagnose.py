"""`collbench diagnose` on step records whose counters a test sets: each cause class named with
its host (or link, or port and priority) and evidence, a spike that is not a regression, a quiet
series with no suspect, and bad input (hostile lines, a foreign baseline, records without
counters). The real-run side (real mpirun ranks, a CPU-throttled host, fixture counters driven
while the ranks run) is tests/test_diagnose_real.py."""

import json
import random
import subprocess
import sys

import pytest

HOSTS = [f"h{i}" for i in range(8)]
T0 = 1795400000.0


def rec(i, lat, moved=None, straggler=None, congestion=True, hosts=HOSTS, ranks=16, transport="ucx",
        op="allreduce", size=("4MB", 4194304), engine="builtin", off_cpu=None):
    ts = T0 + i
    r = {"schema": 1, "time": "2026-11-23T10:00:00.000Z", "ts": ts, "type": "result", "run_id": "20261123T100000-0badcafe",
         "hosts": hosts, "nodes": len(hosts), "ranks": ranks, "engine": engine, "mpi": "mpirun (Open MPI) 4.1.4",
         "transport": transport, "op": op, "datatype": "float", "size": size[0], "size_bytes": size[1],
         "latency_avg_us": lat, "latency_min_us": lat * 0.95, "latency_max_us": lat * 1.05, "iterations": 100,
         "warmup": 10, "algbw_bytes_per_s": 1e9, "busbw_bytes_per_s": 1e9, "validation": "off",
         "straggler_rank": straggler, "verdict": None, "status": "ok", "iteration": i + 1, "t_start": ts - 0.5,
         "t_end": ts, "seq": i + 1}
    if off_cpu is not None:     # (rank, its off-CPU share, the mean over ranks)
        r.update(offcpu_rank=off_cpu[0], offcpu_share_max=off_cpu[1], offcpu_share_avg=off_cpu[2])
    if congestion:
        moved = dict(moved or {})
        totals = {}
        for k, d in moved.items():
            name = k.split("|", 1)[1].split("@", 1)[0]
            totals[name] = totals.get(name, 0) + d
        r["congestion"] = {"source": "engine", "t_start": ts - 0.5, "t_end": ts, "hosts_read": len(hosts),
                           "moved": moved, "totals": totals}
    return r


def series(n=120, onset=70, factor=1.6, slow_moved=None, noise=True, seed=3, slow_straggler=None, slow_off_cpu=None,
           **kw):
    """n steps, the latency `factor` times higher from `onset` on, with `slow_moved` (host -> {key: delta})
    in those steps and a little background ECN on random hosts in every step."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        slow = i >= onset
        moved = {}
        if noise:
            moved[f"h{rng.randrange(8)}|InCEPkts@netstat"] = rng.randint(1, 5)
        if slow and slow_moved:
            moved.update(slow_moved)
        strag = slow_straggler if slow and slow_straggler is not None else rng.randrange(16)
        # the rank off its CPU the most: in quiet steps any rank, by a hair; `slow_off_cpu` held off
        # its CPU 70 % of the loop (its peers 4 %) in the slow steps
        off = ((slow_off_cpu, 0.7, (0.7 + 15 * 0.04) / 16) if slow and slow_off_cpu is not None
               else (rng.randrange(16), 0.05, 0.04))
        out.append(rec(i, 1000 * rng.gauss(1, 0.02) * (factor if slow else 1), moved, strag,
                       off_cpu=off if slow_off_cpu is not None else None, **kw))
    return out


def write(path, records, extra_lines=()):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return str(path)


def diagnose(*args):
    p = subprocess.run([sys.executable, "-m", "collbench", "diagnose", *map(str, args), "--format", "json"],
                       capture_output=True, text=True, timeout=120)
    doc = json.loads(p.stdout) if p.stdout.strip() else None
    return p.returncode, doc, p.stderr


def test_ecn_marks_echoed_to_one_sender_name_its_outgoing_path(tmp_path):
    # TCP: h5's egress is marked: it alone counts TCPDeliveredCE; every receiver counts some InCEPkts
    slow = {"h5|TCPDeliveredCE@netstat": 3000, **{f"h{p}|InCEPkts@netstat": 430 for p in range(8) if p != 5}}
    rc, doc, err = diagnose(write(tmp_path / "r.jsonl", series(slow_moved=slow)))
    assert rc == 1, err
    assert doc["verdict"] == "culprit" and len(doc["regressions"]) == 1
    reg = doc["regressions"][0]
    assert reg["method"] == "shift" and reg["slow_steps"] >= 40 and 1.4 < reg["ratio"] < 1.8
    top = doc["suspects"][0]
    assert (top["host"], top["cause"], top["link"]) == ("h5", "congestion", None)
    assert "outgoing path" in top["detail"]
    ev = top["evidence"]["counters"][0]
    assert (ev["counter"], ev["side"], ev["share_of_hosts"]) == ("TCPDeliveredCE", "rp", 1.0)
    assert ev["rate_good_per_s"] == 0 and ev["rate_slow_per_s"] == 6000 and ev["slow_step_share"] == 1.0


def test_receiver_side_marks_on_one_host_are_incast_into_it(tmp_path):
    slow = {"h2|np_ecn_marked_roce_packets@mlx5_0/1": 12000,
            **{f"h{p}|rp_cnp_handled@mlx5_0/1": 900 for p in range(8) if p != 2}}
    rc, doc, _ = diagnose(write(tmp_path / "r.jsonl", series(slow_moved=slow)))
    top = doc["suspects"][0]
    assert rc == 1 and (top["host"], top["cause"], top["port"]) == ("h2", "congestion", "mlx5_0/1")
    assert top["detail"].startswith("incast into h2")


def test_one_sender_and_one_receiver_name_the_link_between_them(tmp_path):
    slow = {"h1|rp_cnp_handled@mlx5_0/1": 5000, "h6|np_ecn_marked_roce_packets@mlx5_1/1": 9000}
    rc, doc, _ = diagnose(write(tmp_path / "r.jsonl", series(slow_moved=slow)))
    top = doc["suspects"][0]
    assert rc == 1 and top["cause"] == "congestion" and top["link"] == ["h1", "h6"] and top["host"] is None


def test_pauses_without_ecn_are_pfc_with_port_and_priority(tmp_path):
    slow = {"h3|tx_prio3_pause@ens1f0np0": 310, "h3|tx_prio3_pause_duration@ens1f0np0": 240000}
    rc, doc, _ = diagnose(write(tmp_path / "r.jsonl", series(slow_moved=slow, noise=False)))
    top = doc["suspects"][0]
    assert rc == 1 and (top["host"], top["cause"], top["port"], top["priority"]) == ("h3", "pfc", "ens1f0np0", 3)
    assert "cannot drain" in top["detail"]
    assert top["evidence"]["counters"][0]["direction"] == "tx"


def test_a_pause_storm_is_named(tmp_path):
    slow = {"h4|tx_pause_storm_warning_events@ens1f0np0": 12}
    rc, doc, _ = diagnose(write(tmp_path / "r.jsonl", series(slow_moved=slow, noise=False)))
    top = doc["suspects"][0]
    assert rc == 1 and (top["host"], top["cause"]) == ("h4", "pfc") and "pause storm" in top["detail"]


def test_symbol_errors_and_retransmissions_are_link_errors(tmp_path):
    slow = {"h7|symbol_error@mlx5_0/1": 40, "h7|roce_adp_retrans@mlx5_0/1": 80}
    rc, doc, _ = diagnose(write(tmp_path / "r.jsonl", series(slow_moved=slow)))
    top = doc["suspects"][0]
    assert rc == 1 and (top["host"], top["cause"], top["port"]) == ("h7", "link_errors", "mlx5_0/1")


def test_a_counter_that_moves_as_much_in_good_steps_is_no_evidence(tmp_path):
    recs = series(slow_moved={"h3|symbol_error@mlx5_0/1": 40})
    for r in recs[:70]:           # the same errors before the shift: they do not explain it
        r["congestion"]["moved"]["h3|symbol_error@mlx5_0/1"] = 40
        r["congestion"]["totals"]["symbol_error"] = 40
    rc, doc, _ = diagnose(write(tmp_path / "r.jsonl", recs))
    assert rc == 1 and [s["cause"] for s in doc["suspects"]] == ["unexplained"]
    assert doc["verdict"] == "unexplained" and doc["suspects"][0]["host"] is None


def test_a_host_whose_rank_the_others_waited_for_is_a_slow_host(tmp_path):
    # 16 ranks on 8 hosts, two per host: rank 9 is on h4
    rc, doc, _ = diagnose(write(tmp_path / "r.jsonl", series(slow_off_cpu=9, noise=False)))
    top = doc["suspects"][0]
    assert rc == 1 and (top["host"], top["cause"]) == ("h4", "slow_host"), doc["suspects"]
    assert top["evidence"]["off_cpu"] == {**top["evidence"]["off_cpu"], "slow_steps_waited_for": 50,
                                          "slow_steps": 50, "share_good": 0.0}
    # on its CPU 30 % of the loop, its peers 96 %
    assert (top["evidence"]["off_cpu"]["on_cpu_share"], top["evidence"]["off_cpu"]["peers_on_cpu_share"]) == (0.3, 0.96)
    assert "no congestion counter moving" in top["detail"] and "waited for" in top["detail"]


def test_the_slowest_rank_alone_names_no_slow_host(tmp_path):
    # rank 9 the slowest (straggler_rank) in every slow step: the rank that waits longest in the calls
    # is usually one that waited for a late peer, not the cause; without the off-CPU rank nothing is named
    rc, doc, _ = diagnose(write(tmp_path / "r.jsonl", series(slow_straggler=9, noise=False)))
    assert rc == 1 and [s["cause"] for s in doc["suspects"]] == ["unexplained"], doc["suspects"]
    assert any("per-rank off-CPU shares" in x for x in doc["suspects"][0]["evidence"]["lacking"])


def test_records_without_counters_say_what_evidence_was_lacking(tmp_path):
    rc, doc, _ = diagnose(write(tmp_path / "r.jsonl", series(congestion=False)))
    assert rc == 1 and doc["verdict"] == "unexplained"
    top = doc["suspects"][0]
    assert top["cause"] == "unexplained" and top["host"] is None
    assert any("congestion counters" in x for x in top["evidence"]["lacking"])
    assert any("carry no congestion counters" in n for n in doc["notes"])


def test_osu_records_lack_per_rank_timings_and_per_host_counters(tmp_path):
    recs = series(congestion=False, engine="osu")
    for r in recs:
        r["straggler_rank"] = None
    rc, doc, _ = diagnose(write(tmp_path / "r.jsonl", recs))
    lacking = doc["suspects"][0]["evidence"]["lacking"]
    assert rc == 1 and any("per-rank off-CPU" in x for x in lacking) and any("congestion" in x for x in lacking)


def test_a_quiet_series_and_a_spike_are_no_regression(tmp_path):
    recs = series(factor=1.0, slow_moved={"h2|np_ecn_marked_roce_packets@mlx5_0/1": 50})
    recs[90]["latency_avg_us"] *= 20            # one step 20x slower: a spike, not a shift
    recs[91]["latency_avg_us"] *= 5
    rc, doc, err = diagnose(write(tmp_path / "r.jsonl", recs))
    assert rc == 0, err
    assert doc["verdict"] == "no regression" and doc["regressions"] == [] and doc["suspects"] == []
    p = subprocess.run([sys.executable, "-m", "collbench", "diagnose", str(tmp_path / "r.jsonl")],
                       capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith("no regression")


def test_without_a_baseline_the_shift_gate_is_the_alerts_shift_ratio(tmp_path):
    """The shift test's size gate is the config's alerts.shift_ratio, the gate of the alert that sent
    the operator here: a lasting 1.35x rise is a regression at the default (1.2) and none where the
    alert asks for 1.5x; a 1.6x rise is one under both."""
    mild = write(tmp_path / "mild.jsonl", series(factor=1.35))
    strong = write(tmp_path / "strong.jsonl", series(factor=1.6))
    cfg = tmp_path / "collbench.yaml"
    cfg.write_text("alerts:\n  shift_ratio: 1.5\n")
    rc, doc, err = diagnose(mild)
    assert rc == 1 and doc["regressions"] and doc["regressions"][0]["method"] == "shift", err
    rc, doc, err = diagnose(mild, "--config", cfg)
    assert rc == 0 and doc["verdict"] == "no regression", (err, doc["regressions"])
    rc, doc, err = diagnose(strong, "--config", cfg)
    assert rc == 1 and 1.4 < doc["regressions"][0]["ratio"] < 1.8, err


def test_against_a_baseline_the_slow_steps_are_those_above_its_bound(tmp_path):
    quiet = write(tmp_path / "quiet.jsonl", series(n=20, factor=1.0))
    p = subprocess.run([sys.executable, "-m", "collbench", "baseline", "save", "b1", "--from", quiet, "--state-dir",
                        str(tmp_path / "state")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    slow = {"h5|TCPDeliveredCE@netstat": 3000}
    cur = write(tmp_path / "cur.jsonl", series(n=12, onset=4, slow_moved=slow))
    rc, doc, err = diagnose(cur, "--baseline", "b1", "--state-dir", tmp_path / "state")
    assert rc == 1, err
    assert doc["method"] == "baseline" and doc["baseline"] == "b1"
    assert doc["regressions"][0]["slow_steps"] == 8 and doc["regressions"][0]["good_steps"] == 4
    assert (doc["suspects"][0]["host"], doc["suspects"][0]["cause"]) == ("h5", "congestion")
    # a baseline of another cluster (other ranks and transport) matches nothing: exit 2 saying so
    other = write(tmp_path / "other.jsonl", series(n=12, ranks=8, transport="ob1-tcp",
                                                   hosts=["x1", "x2", "x3", "x4"]))
    rc, doc, err = diagnose(other, "--baseline", "b1", "--state-dir", tmp_path / "state")
    assert rc == 2 and doc is None
    assert "no series of the results matches it" in err and "16 ranks/8 nodes/ucx" in err and "ob1-tcp" in err


def test_hostile_and_mixed_lines_are_counted_and_the_rest_diagnosed(tmp_path):
    slow = {"h5|TCPDeliveredCE@netstat": 3000}
    hostile = ["not json", "[" * 5000, '{"type":"result","latency_avg_us":"fast"}',
               json.dumps({**rec(0, 1000.0), "congestion": {"source": "engine", "moved": {"h1|x@y": -5}}}),
               json.dumps(rec(1, 1e300, hosts=["\x1b[31mevil"], ranks=1)).replace("1e+300", "1e400"),
               "\xff\xfe"]
    recs = series(slow_moved=slow) + series(n=30, factor=1.0, op="bcast", size=("1KB", 1024), seed=9)
    rc, doc, err = diagnose(write(tmp_path / "r.jsonl", recs, hostile))
    assert rc == 1, err
    assert doc["input"]["bad_lines"] == len(hostile) and doc["input"]["results"] == 150
    assert (doc["suspects"][0]["host"], doc["suspects"][0]["cause"]) == ("h5", "congestion")
    assert any("6 bad line(s)" in n for n in doc["notes"])
    assert not any("fewer than 16 steps" in n for n in doc["notes"])   # 30 bcast steps: judged


def test_nothing_usable_is_exit_2_naming_the_file(tmp_path):
    path = write(tmp_path / "junk.jsonl", [], ["garbage", "{}"])
    rc, doc, err = diagnose(path)
    assert rc == 2 and doc is None and "junk.jsonl" in err and "no usable result record" in err
    rc, _, err = diagnose(tmp_path / "missing.jsonl")
    assert rc == 2 and "missing.jsonl" in err
    rc, _, err = diagnose(path, "--since", "yesterday-ish")
    assert rc == 2 and "--since" in err


def test_routine_tcp_retransmissions_beside_delivered_packets_are_no_evidence(tmp_path):
    # 40 fast retransmissions beside 48,000 delivered packets: loss recovery, not a bad link
    slow = {"h3|TCPFastRetrans@netstat": 40, "h3|TCPDelivered@netstat": 48000}
    rc, doc, _ = diagnose(write(tmp_path / "r.jsonl", series(slow_moved=slow, noise=False)))
    assert rc == 1 and [s["cause"] for s in doc["suspects"]] == ["unexplained"], doc["suspects"]
    # 4,000 of them (8 %) are
    slow["h3|TCPFastRetrans@netstat"] = 4000
    rc, doc, _ = diagnose(write(tmp_path / "r2.jsonl", series(slow_moved=slow, noise=False)))
    assert rc == 1 and (doc["suspects"][0]["host"], doc["suspects"][0]["cause"]) == ("h3", "link_errors")


def test_retransmissions_spread_over_every_host_name_no_link(tmp_path):
    # every host retransmits alike (8 % of what it delivers) in the slow steps: load or the whole
    # fabric, not one host's cable
    slow = {f"h{h}|{name}@netstat": n for h in range(8)
            for name, n in (("TCPFastRetrans", 4000), ("TCPDelivered", 48000))}
    rc, doc, _ = diagnose(write(tmp_path / "r.jsonl", series(slow_moved=slow, noise=False)))
    assert rc == 1 and [s["cause"] for s in doc["suspects"]] == ["unexplained"], doc["suspects"]
    # the same on one host more than on all the others together is its link
    slow["h6|TCPFastRetrans@netstat"] = 40000
    rc, doc, _ = diagnose(write(tmp_path / "r2.jsonl", series(slow_moved=slow, noise=False)))
    assert rc == 1 and (doc["suspects"][0]["host"], doc["suspects"][0]["cause"]) == ("h6", "link_errors")


def test_without_results_the_state_directory_is_read(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    rc, _, err = diagnose("--state-dir", state)
    assert rc == 2 and "no RESULTS given" in err and str(state) in err
    write(state / "results.jsonl", series(slow_moved={"h7|symbol_error@mlx5_0/1": 40}))
    rc, doc, err = diagnose("--state-dir", state)
    assert rc == 1 and doc["input"]["files"] == [str(state / "results.jsonl")], err
    assert (doc["suspects"][0]["host"], doc["suspects"][0]["cause"]) == ("h7", "link_errors")


def test_against_a_baseline_every_step_slow_the_waited_for_host_is_named(tmp_path):
    # every step slow against a baseline: no good step to compare with, but quiet steps name no
    # waited-for rank at all (the off-CPU share is the rank's, not the op's structure)
    quiet = write(tmp_path / "quiet.jsonl", series(n=20, factor=1.0, noise=False))
    p = subprocess.run([sys.executable, "-m", "collbench", "baseline", "save", "b1", "--from", quiet, "--state-dir",
                        str(tmp_path / "state")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    cur = write(tmp_path / "cur.jsonl", series(n=6, onset=0, slow_off_cpu=9, noise=False))
    rc, doc, err = diagnose(cur, "--baseline", "b1", "--state-dir", tmp_path / "state")
    assert rc == 1 and [(s["host"], s["cause"]) for s in doc["suspects"]] == [("h4", "slow_host")], doc["suspects"]
    assert doc["suspects"][0]["evidence"]["off_cpu"]["share_good"] is None
    # two slow steps are too few, and the diagnosis says so
    cur = write(tmp_path / "cur2.jsonl", series(n=2, onset=0, slow_off_cpu=9, noise=False))
    rc, doc, err = diagnose(cur, "--baseline", "b1", "--state-dir", tmp_path / "state")
    assert rc == 1 and [s["cause"] for s in doc["suspects"]] == ["unexplained"], doc["suspects"]
    assert any("fewer than 3" in x for x in doc["suspects"][0]["evidence"]["lacking"])


@pytest.mark.parametrize("level, fault_steps", [(1.15, 20), (1.25, 20), (1.25, 6)])
def test_changes_of_level_in_a_long_log_do_not_dilute_a_real_shift(tmp_path, level, fault_steps):
    """A long quiet log whose level wanders up for a while (a machine's load), the last wander
    running straight into a real congestion fault: only the fault's steps are slow, so its counters
    are the evidence. Pooling the wandering steps with the fault's made their median the slow
    steps' and the verdict `unexplained` (seen on the testbed: 12-13 ms wandering to 15 ms before
    an 8x fault), also when a wander big enough to fire on its own (1.25x) joins the fault's
    excursion, and when the fault is only a few steps old."""
    rng = random.Random(21)
    recs = []
    fault = {"h5|TCPDeliveredCE@netstat": 3000, **{f"h{p}|InCEPkts@netstat": 430 for p in range(8) if p != 5}}
    n = 260
    for i in range(n):
        slow = i >= n - fault_steps
        wander = 60 <= i < 100 or 150 <= i < n - fault_steps      # the second runs into the fault
        moved = {f"h{rng.randrange(8)}|InCEPkts@netstat": rng.randint(1, 5)}
        if slow:
            moved.update(fault)
        recs.append(rec(i, 1000 * rng.gauss(1, 0.02) * (8.0 if slow else level if wander else 1.0), moved,
                        rng.randrange(16)))
    rc, doc, err = diagnose(write(tmp_path / "r.jsonl", recs))
    assert rc == 1, (err, doc)
    (reg,) = doc["regressions"]
    assert reg["slow_steps"] == fault_steps and reg["ratio"] > 6, reg
    top = doc["suspects"][0]
    assert (top["host"], top["cause"]) == ("h5", "congestion"), doc["suspects"]
