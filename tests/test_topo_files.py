"""What `topo map` writes: the launch files' formats, real launchers accepting them (Open MPI's
rankfile and sequential hostfile, MPICH's machinefile), the CLI's table/CSV/JSON, and the heat map
pictures."""

import csv
import io
import json
import os
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import yaml

from collbench.topo import order_files
from collbench.topo.heatmap import write_heatmap
from collbench.pair_matrix import TopoMatrix, save_csv, save_json
from collbench.topo.outliers import find_outliers

from conftest import is_root, require_tool
from topo_helpers import from_cost, rack_cost, rack_matrix

LABELS = ["n3", "n1", "n1:1", "n2", "n2:1", "n0"]


def test_rankfile_format():
    text = order_files.rankfile_text(LABELS, "made by a test")
    assert text.splitlines() == ["# made by a test", "rank 0=n3 slot=0", "rank 1=n1 slot=0", "rank 2=n1 slot=1",
                                 "rank 3=n2 slot=0", "rank 4=n2 slot=1", "rank 5=n0 slot=0"]


def test_hostfile_machinefile_slurm_and_config_formats():
    assert order_files.hostfile_text(LABELS).splitlines() == ["n3", "n1", "n1", "n2", "n2", "n0"]
    # consecutive ranks on one host merge into host:k
    assert order_files.machinefile_text(LABELS, "c").splitlines() == ["# c", "n3:1", "n1:2", "n2:2", "n0:1"]
    assert order_files.machinefile_text(["a", "b", "a"]).splitlines() == ["a:1", "b:1", "a:1"]
    assert order_files.slurm_hostfile_text(LABELS) == "n3\nn1\nn1\nn2\nn2\nn0\n"
    doc = yaml.safe_load(order_files.hosts_order_text(LABELS, "c"))
    assert doc == {"hosts_order": ["n3", "n1", "n1", "n2", "n2", "n0"]}


def test_write_order_files_is_complete_and_refuses_bad_dirs(tmp_path):
    out = tmp_path / "new" / "dir"
    written = order_files.write_order_files(str(out), "ring", LABELS, {"x": 1}, "c")
    assert sorted(os.path.basename(p) for p in written.values()) == sorted(
        f"ring.{s}" for s in order_files.SUFFIXES)
    assert json.loads((out / "ring.mapping.json").read_text()) == {"x": 1}
    blocker = tmp_path / "file"
    blocker.write_text("x")
    from collbench.errors import UserError
    with pytest.raises(UserError, match="--out-dir"):
        order_files.write_order_files(str(blocker), "ring", LABELS, {}, None)


def test_topo_measure_refuses_an_out_dir_that_is_a_file_before_running(tmp_path):
    """topo measure checks --out-dir with topo map's check (order_files.check_out_dir): exit 2
    naming it, nothing run."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = subprocess.run([sys.executable, "-m", "collbench", "topo", "measure", "--out-dir", str(blocker)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"--out-dir {blocker}: cannot create: File exists" in r.stderr, r.stderr
    assert blocker.read_text() == "x"


def mpirun_argv(np_, oversubscribe=True):
    argv = [require_tool("mpirun"), "-np", str(np_)] + (["--oversubscribe"] if oversubscribe else [])
    if is_root():
        argv.append("--allow-run-as-root")
    return argv


@pytest.mark.mpi
def test_open_mpi_accepts_the_rankfile(tmp_path):
    """A real mpirun places the ranks where the rankfile says: rank 0 on slot 1, rank 1 on slot 0."""
    m = TopoMatrix.from_rows(["localhost:0", "localhost:1"], "latency", [[None, 5.0], [5.0, None]])
    f = tmp_path / "m.csv"
    save_csv(f, m)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "collbench", "topo", "map", "--pattern", "ring", "--matrix",
                        str(f), "--out-dir", str(out), "--method", "greedy"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    rankfile = out / "ring.rankfile"
    lines = [ln for ln in rankfile.read_text().splitlines() if not ln.startswith("#")]
    assert lines == ["rank 0=localhost slot=0", "rank 1=localhost slot=1"]
    # swap the slots to see mpirun follow the file, not its defaults
    rankfile.write_text(rankfile.read_text().replace("slot=0", "slot=X").replace("slot=1", "slot=0")
                        .replace("slot=X", "slot=1"))
    job = subprocess.run(mpirun_argv(2) + ["--rankfile", str(rankfile), "--report-bindings",
                                           "sh", "-c", "echo rank=$OMPI_COMM_WORLD_RANK"],
                         capture_output=True, text=True, timeout=120)
    assert job.returncode == 0, job.stderr
    assert sorted(job.stdout.split()) == ["rank=0", "rank=1"]
    bindings = {ln.split("MCW rank ")[1].split()[0]: ln for ln in job.stderr.splitlines() if "MCW rank" in ln}
    assert "core 1[" in bindings["0"] and "core 0[" in bindings["1"], job.stderr


@pytest.mark.mpi
def test_open_mpi_sequential_mapper_accepts_the_hostfile(tmp_path):
    # the sequential mapper matches names literally: use this machine's name, not localhost; it
    # does not count slots, and Open MPI 4.1.4's mpirun crashes at exit with --oversubscribe + seq
    host = socket.gethostname().split(".")[0]
    path = tmp_path / "ring.hostfile"
    path.write_text(order_files.hostfile_text([host + ":0", host + ":1", host + ":2"], "seq"))
    job = subprocess.run(mpirun_argv(3, oversubscribe=False) + ["--hostfile", str(path), "--mca", "rmaps", "seq",
                                           "sh", "-c", "echo rank=$OMPI_COMM_WORLD_RANK"],
                         capture_output=True, text=True, timeout=120)
    assert job.returncode == 0, job.stderr
    assert sorted(job.stdout.split()) == ["rank=0", "rank=1", "rank=2"]


@pytest.mark.mpi
def test_mpich_accepts_the_machinefile(tmp_path):
    path = tmp_path / "ring.machinefile"
    path.write_text(order_files.machinefile_text(["localhost:0", "localhost:1"], "hydra"))
    assert path.read_text().splitlines()[1] == "localhost:2"
    job = subprocess.run([require_tool("mpirun.mpich"), "-f", str(path), "-n", "2",
                          "sh", "-c", "echo rank=$PMI_RANK"], capture_output=True, text=True, timeout=120)
    assert job.returncode == 0, job.stderr
    assert sorted(job.stdout.split()) == ["rank=0", "rank=1"]


def run_map(*args):
    return subprocess.run([sys.executable, "-m", "collbench", "topo", "map", *args],
                          capture_output=True, text=True, timeout=300)


def test_cli_table_csv_json(tmp_path):
    c, rack = rack_cost(8, 4, seed=5)
    lat = from_cost(c, "latency", prefix="node")
    bw = from_cost(c, "bandwidth", prefix="node")
    f = tmp_path / "both.json"
    save_json(f, [lat, bw])
    out = tmp_path / "out"
    table = run_map("--pattern", "ring", "--matrix", str(f), "--out-dir", str(out))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("ring allgather (ring) over 8 ranks, metric bandwidth")
    methods = [ln.split()[1] if ln.startswith("  *") else ln.split()[0] for ln in lines[4:8]]
    assert methods == ["identity", "greedy", "heuristic", "exact"]
    assert any(ln.startswith("  *") and " exact " in ln for ln in lines)
    assert "wrote" in table.stderr and str(out / "ring.rankfile") in table.stderr

    got = run_map("--pattern", "recursive-doubling", "--matrix", str(f), "--metric", "latency",
                  "--out-dir", str(out), "--format", "csv")
    assert got.returncode == 0, got.stderr
    rows = list(csv.DictReader(io.StringIO(got.stdout)))
    assert [r["method"] for r in rows] == ["identity", "greedy", "heuristic", "exact"]
    assert rows[0]["vs_identity"] == "1" and rows[0]["cost_unit"] == "us"
    assert sum(int(r["chosen"]) for r in rows) == 1

    js = run_map("--pattern", "ring", "--matrix", str(f), "--out-dir", str(out), "--format", "json",
                 "--method", "greedy")
    assert js.returncode == 0, js.stderr
    doc = json.loads(js.stdout)
    assert doc["chosen"] == "greedy" and doc["metric"] == "bandwidth" and doc["ranks"] == 8
    assert "deprecated" not in js.stderr
    # the method's older name still runs it, with a warning naming the new one
    old = run_map("--pattern", "ring", "--matrix", str(f), "--out-dir", str(out), "--format", "json",
                  "--method", "seed")
    assert old.returncode == 0, old.stderr
    assert json.loads(old.stdout)["chosen"] == "greedy" and json.loads(old.stdout)["order"] == doc["order"]
    assert "warning: --method seed is deprecated, use --method greedy" in old.stderr, old.stderr
    assert sorted(doc["order"]) == list(range(8))
    assert doc["files"]["rankfile"] == str(out / "ring.rankfile")
    # every written form carries the same order
    hosts = doc["hosts_order"]
    assert yaml.safe_load((out / "ring.hosts_order.yaml").read_text())["hosts_order"] == hosts
    assert (out / "ring.slurm_hostfile").read_text().split() == hosts
    assert [ln.split("=")[1].split()[0] for ln in (out / "ring.rankfile").read_text().splitlines()
            if ln.startswith("rank")] == hosts
    assert json.loads((out / "ring.mapping.json").read_text())["hosts_order"] == hosts


def test_cli_flag_errors_exit_2(tmp_path):
    f = tmp_path / "m.csv"
    save_csv(f, from_cost(rack_cost(4, 2, seed=1)[0]))
    for args in (["--pattern", "tree", "--matrix", str(f)],
                 ["--pattern", "ring", "--matrix", str(f), "--method", "best"],
                 ["--pattern", "ring", "--matrix", str(f), "--time-limit", "-1"],
                 ["--pattern", "ring"]):
        r = run_map(*args, "--out-dir", str(tmp_path / "o"))
        assert r.returncode == 2, (args, r.stderr)
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    r = run_map("--pattern", "ring", "--matrix", str(f), "--out-dir", str(blocker))
    assert r.returncode == 2 and "--out-dir" in r.stderr


@pytest.mark.parametrize("fmt", ["png", "svg"])
def test_heatmap_pictures(tmp_path, fmt):
    m = rack_matrix(16, 2, seed=2, slow_host=5, slow_link=(1, 3))
    rep = find_outliers(m)
    path = write_heatmap(m, str(tmp_path / f"lat.{fmt}"), outliers=rep)
    data = open(path, "rb").read()
    assert len(data) > 1000
    if fmt == "png":
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        from matplotlib import image
        img = image.imread(path)
        assert img.shape[0] > 200 and img.shape[1] > 200
    else:
        root = ET.fromstring(data)
        assert root.tag.endswith("svg")
        assert b"node5" in data                    # the host names are on the axes
    big = rack_matrix(80, 4, seed=1, metric="bandwidth")
    p2 = write_heatmap(big, str(tmp_path / f"big.{fmt}"))
    assert os.path.getsize(p2) > 1000
    from collbench.errors import UserError
    with pytest.raises(UserError, match="expected .png or .svg"):
        write_heatmap(m, str(tmp_path / "lat.jpg"))
