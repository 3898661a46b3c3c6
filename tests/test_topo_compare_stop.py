"""topo compare on a long plan (issue 19 item 4): the matrix's estimate is announced before the
first job, progress lines carry the time left, and a real run stopped by SIGTERM or Ctrl-C
stops its MPI job, exits 143 / 130 and keeps (writes and prints) what finished."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from collbench.pair_matrix import TopoMatrix, save_json
from collbench.results.record_parser import is_record, parse_record
from conftest import REPO

pytestmark = [pytest.mark.mpi]


def _environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _setup(tmp_path, gbps):
    """A 4-rank config on this machine's two names and a bandwidth matrix over its ranks."""
    host = os.uname().nodename
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"hosts": [f"{host}:2", "localhost:2"], "transport": "shm", "step_timeout": 300,
                                   "oversubscribe": True}))
    labels = [host, f"{host}:1", "localhost", "localhost:1"]
    rows = [[None if i == j else gbps * (1 + (i // 2 == j // 2)) for j in range(4)] for i in range(4)]
    save_json(tmp_path / "m.json", [TopoMatrix.from_rows(labels, "bandwidth", rows)])
    return cfg, tmp_path / "m.json"


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stopped_compare_warns_first_shows_time_left_and_keeps_what_finished(tmp_path, sig, code):
    # a matrix of 0.001 GB/s links: the 64KB plan below is predicted to take hours (it runs on
    # shared memory here, in seconds per block, so it is stopped after a few blocks)
    cfg, matrix = _setup(tmp_path, 0.001)
    results = tmp_path / "r.jsonl"
    results.write_text('{"kept": true}\n')
    env = dict(os.environ, COLLBENCH_TEST_TOKEN=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "collbench", "topo", "compare", "--config", str(cfg),
                             "--matrix", str(matrix), "--patterns", "ring", "--sizes", "64KB",
                             "--iterations", "200000", "--blocks", "1000", "--format", "json",
                             "--results", str(results)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if sum(ln.startswith("[") for ln in lines) >= 3:
                break
        progress = [ln for ln in lines if ln.startswith("[")]
        assert len(progress) >= 3, "".join(lines)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(lines) + err
    assert proc.returncode == code, err
    # warned before the first job, with the matrix's estimate
    warning = next(i for i, ln in enumerate(lines) if "warning: the matrix predicts about" in ln)
    assert warning < next(i for i, ln in enumerate(lines) if ln.startswith("["))
    assert "h" in lines[warning].split("predicts about ")[1].split()[0]       # hours, e.g. "41h07m"
    # progress: [done/total] with the blocks of both orders, and the time left
    assert progress[0].startswith("[1/2000] ring, original order: allgather 64KB: block of 200 calls")
    assert all("left" in ln for ln in progress[1:3]), progress
    assert f"collbench topo compare: {'terminated' if code == 143 else 'interrupted'} after" in err
    assert " of 2000 blocks; writing what finished" in err
    assert "writing what finished" in err
    # what finished is printed (stdout) and appended (results) ...
    doc = json.loads(out)
    assert doc["stopped"].startswith("after ") and doc["stopped"].endswith("of 2000 blocks")
    (point,) = doc["points"]
    assert point["blocks_original"] >= 3 and point["blocks_new"] == 0, (err, point)
    assert point["note"] == "stopped before both orders were measured"
    recs = [parse_record(line) for line in open(results) if '"kept"' not in line]
    assert all(is_record(x) for x in recs)
    res = [x for x in recs if x["type"] == "result"]
    assert len(res) == point["blocks_original"] and {x["order"] for x in res} == {"original"}
    assert recs[-1]["event"] == "topo_compare" and "stopped after" in recs[-1]["detail"]
    assert open(results).readline() == '{"kept": true}\n'
    # ... and the MPI job was stopped, not orphaned
    left = [p for p in os.listdir("/proc") if p.isdigit() and f"COLLBENCH_TEST_TOKEN={tmp_path}" in _environ(p)]
    assert [(p, open(f"/proc/{p}/cmdline").read()) for p in left] == []


def test_no_warning_when_the_matrix_predicts_a_short_run(tmp_path):
    cfg, matrix = _setup(tmp_path, 10.0)
    r = subprocess.run([sys.executable, "-m", "collbench", "topo", "compare", "--config", str(cfg),
                        "--matrix", str(matrix), "--patterns", "ring", "--sizes", "4KB", "--iterations", "20",
                        "--blocks", "2", "--format", "json"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("[")]
    assert [ln.split("]")[0] for ln in progress] == ["[1/4", "[2/4", "[3/4", "[4/4"], r.stderr
    assert "left" in progress[0] and "left" not in progress[-1]
    assert "stopped" not in json.loads(r.stdout)
