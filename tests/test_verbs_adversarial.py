"""locate, doctor, scrape-config, diagnose and sweep tried as an adversary would (issue 26, "The
other verbs"): state directories, sysfs trees and mlnx_qos outputs holding FIFOs (a stand-in for a
stuck driver), links to /dev/zero, garbage and terminal escapes; flags that inject YAML or reach
before 1970; names that are not names; a config past the engine's limits.

One table row per case: what is set up, the command, the exit code expected, fragments the output
must hold and must never hold. Every row failed on the code before issue 26 (a hang past the
row's timeout, a traceback, a MemoryError, a wrong exit code, or the fragment missing); each is a
real `python -m collbench` process on real files, FIFOs and devices, with its process group killed
when it overruns. The rows reading /dev/zero run under an address-space limit, so the old code's
unbounded read fails in a second with a MemoryError instead of taking the machine's memory.
"""

import json
import os
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

import pytest

from conftest import REPO
from test_doctor import fleet, write_config

ESC = "\x1b"
UNRESOLVABLE = ["badhost1.invalid", "badhost2.invalid", "badhost3.invalid"]


def run(argv, timeout, mem_bytes=None):
    """`python -m collbench ARGV` in its own process group; (returncode or 'hung', stdout, stderr)."""
    def limits():
        if mem_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    p = subprocess.Popen([sys.executable, "-m", "collbench", *argv], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True,
                         preexec_fn=limits, stdin=subprocess.DEVNULL)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return "hung", out, err


@dataclass
class Case:
    name: str
    setup: Callable            # tmp_path -> (argv, ctx dict)
    rc: object                 # expected exit code (or a tuple of them)
    want: tuple = ()           # fragments the output (stdout + stderr) must hold
    never: tuple = ()          # fragments it must never hold (beside "Traceback")
    timeout: float = 30.0
    mem_bytes: int = None
    check: Callable = None     # (stdout, stderr, ctx) -> None: further asserts


# ------------------------------------------------------------------------------- locate

def _locate_config(tmp_path, hosts=UNRESOLVABLE):
    state = tmp_path / "state"
    state.mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"hosts: [{', '.join(hosts)}]\nstate_dir: {state}\n")
    return cfg, state


def _locate_with(name, make):
    """locate on three unresolvable hosts, with the state directory's `name` made by make(path)."""
    def setup(tmp_path):
        cfg, state = _locate_config(tmp_path)
        make(str(state / name))
        return ["locate", "--config", str(cfg), "--format", "json"], {}
    return setup


def _fifo(path):
    os.mkfifo(path)


def _dev_zero(path):
    os.symlink("/dev/zero", path)


def _write(text):
    def make(path):
        with open(path, "w") as f:
            f.write(text)
    return make


def _probe_failed_on_resolution(out, err, ctx):
    doc = json.loads(out)
    failed = [p["failed"] for p in doc["probes"] if p.get("failed")]
    assert failed and "apologize" not in failed[0], failed
    assert ("Could not resolve hostname badhost" in failed[0]
            or "ORTE does not know how to route a message" in failed[0] and "(node badhost" in failed[0]), failed


# the daemon's files unreadable: the daemon counts as not running; the probes then fail on the
# unresolvable hosts (exit 1), saying why (ssh could not resolve the host), never Open MPI's boilerplate
LOCATE = [
    Case("locate_pid_file_fifo", _locate_with("stress.pid", _fifo), 1, check=_probe_failed_on_resolution),
    Case("locate_state_file_fifo", _locate_with("stress.state.json", _fifo), 1, check=_probe_failed_on_resolution),
    Case("locate_pid_file_dev_zero", _locate_with("stress.pid", _dev_zero), 1, never=("MemoryError",),
         mem_bytes=3 << 30, check=_probe_failed_on_resolution),
    Case("locate_state_file_dev_zero", _locate_with("stress.state.json", _dev_zero), 1, never=("MemoryError",),
         mem_bytes=3 << 30, check=_probe_failed_on_resolution),
    Case("locate_state_file_pid_of_wrong_type",
         _locate_with("stress.state.json", _write('{"pid": [1], "status": "running", "proc_start": "x"}')), 1,
         check=_probe_failed_on_resolution),
    Case("locate_openmpi_banner_gives_the_reason", _locate_with("unused", lambda p: None), 1,
         never=("We apologize", "orte_base_help_aggregate"), check=_probe_failed_on_resolution),
]


# ------------------------------------------------------------------------------- doctor

def _doctor_with(change, extra="", results=None, fmt="json"):
    """doctor over three fixture hosts; change(roots of n1) spoils n1's tree."""
    def setup(tmp_path):
        hosts = fleet(tmp_path, n=3)
        change(hosts["n1"])
        cfg = write_config(tmp_path, hosts, extra)
        argv = ["doctor", "--config", cfg, "--format", fmt]
        if results is not None:
            log = tmp_path / "results.jsonl"
            log.write_text(results)
            argv += ["--results", str(log)]
        return argv, {}
    return setup


def _replace(rel, make):
    """Replace the file at rel (under the host's sysfs root, or qos: under its qos_dir) by make(path)."""
    def change(roots):
        base = roots["qos_dir"] if rel.startswith("qos/") else roots["sysfs_root"]
        path = os.path.join(base, rel[4:] if rel.startswith("qos/") else rel)
        if os.path.isdir(path) and not os.path.islink(path):
            import shutil
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
        make(path)
    return change


NET = "class/net/eth2"
PORT = "class/infiniband/mlx5_0/ports/1"


def _n1_reason(*fragments):
    """n1 is degraded or failed with a reason holding every fragment; n2 and n3 stay healthy."""
    def check(out, err, ctx):
        hosts = {h["host"]: h for h in json.loads(out)["hosts"]}
        reasons = [r["reason"] for r in hosts["n1"]["reasons"]]
        assert hosts["n1"]["verdict"] != "healthy", hosts["n1"]
        assert any(all(f in r for f in fragments) for r in reasons), reasons
        assert hosts["n2"]["verdict"] == hosts["n3"]["verdict"] == "healthy", hosts
    return check


def _failure_record(error):
    return json.dumps({"type": "failure", "schema": 1, "ts": 2000, "op": "bcast", "size": "1MB", "hosts": ["n1"],
                       "ranks": 1, "error": error, "status": "failed"}) + "\n"


DOCTOR = [
    Case("doctor_mtu_fifo", _doctor_with(_replace(f"{NET}/mtu", _fifo)), 1, check=_n1_reason("MTU unreadable", "FIFO")),
    Case("doctor_operstate_fifo", _doctor_with(_replace(f"{NET}/operstate", _fifo)), 1,
         check=_n1_reason("operstate", "FIFO")),
    Case("doctor_rate_fifo", _doctor_with(_replace(f"{PORT}/rate", _fifo)), 1, check=_n1_reason("rate unreadable", "FIFO")),
    Case("doctor_gid_type_fifo", _doctor_with(_replace(f"{PORT}/gid_attrs/types/3", _fifo)), 1,
         check=_n1_reason("gid_attrs/types/3", "FIFO")),
    Case("doctor_mlnx_qos_output_fifo", _doctor_with(_replace("qos/eth2", _fifo)), 1,
         check=_n1_reason("mlnx_qos output unreadable", "FIFO")),
    Case("doctor_gid_ndevs_dev_zero", _doctor_with(_replace(f"{PORT}/gid_attrs/ndevs/3", _dev_zero)), 1,
         never=("embedded null byte",), mem_bytes=3 << 30, check=_n1_reason("gid_attrs/ndevs/3", "character device")),
    Case("doctor_gid_ndevs_path_out_of_sysfs", _doctor_with(_replace(f"{PORT}/gid_attrs/ndevs/3", _write("../../../etc\n"))),
         1, check=_n1_reason("gid_attrs/ndevs/3", "interface name")),
    Case("doctor_operstate_terminal_escape", _doctor_with(_replace(f"{NET}/operstate", _write(f"{ESC}]0;owned{ESC}\\\n")),
                                                          fmt="table"), 1, want=("operstate",), never=(ESC,)),
    Case("doctor_link_width_terminal_escape", _doctor_with(lambda roots: None, "  link_width: \"4X\\e[2J\\e]0;owned\\a\"\n",
                                                           fmt="table"), 2, want=("doctor.link_width",), never=(ESC,)),
    Case("doctor_results_error_terminal_escape",
         _doctor_with(lambda roots: None, results=_failure_record(f"rank 0 died{ESC}[2J{ESC}]0;owned\a"), fmt="table"),
         1, want=("rank 0 died\\x1b[2J",), never=(ESC, "\a")),
    Case("doctor_cnp_dscp_garbage", _doctor_with(_replace(f"{NET}/ecn/roce_np/cnp_dscp", _write("garbage\n"))), 1,
         check=_n1_reason("cnp_dscp", "'garbage'", "DSCP")),
    Case("doctor_cnp_dscp_out_of_range", _doctor_with(_replace(f"{NET}/ecn/roce_np/cnp_dscp", _write("999\n"))), 1,
         check=_n1_reason("cnp_dscp", "'999'", "DSCP")),
    Case("doctor_rdma_class_not_a_directory", _doctor_with(_replace("class/infiniband", _write("not a directory\n"))), 1,
         check=_n1_reason("class/infiniband", "not a directory")),
    Case("doctor_rdma_device_not_a_device", _doctor_with(_replace("class/infiniband/mlx5_0", _write("x\n"))), 1,
         check=_n1_reason("class/infiniband/'mlx5_0'", "not a directory (expected an RDMA device)")),
    Case("doctor_netdevs_a_path", _doctor_with(lambda roots: None, "  netdevs: ['../../etc']\n"), 2,
         want=("doctor.netdevs", "interface names")),
]


# ------------------------------------------------------------------------------- scrape-config

def _scrape(*argv, hostfile=None):
    def setup(tmp_path):
        out = tmp_path / "out.yaml"
        extra = []
        if hostfile is not None:
            (tmp_path / "hostfile").write_text(hostfile)
            extra = ["--hostfile", str(tmp_path / "hostfile")]
        return ["scrape-config", *argv, *extra, "-o", str(out)], {"out": out}
    return setup


def _nothing_written(out, err, ctx):
    assert not ctx["out"].exists(), ctx["out"].read_text()


SCRAPE = [
    Case("scrape_config_targets_path_cr", _scrape("--format", "job", "--targets-path", "/x.json\r- job_name: evil"), 2,
         want=("--targets-path",), check=_nothing_written),
    Case("scrape_config_targets_path_nel", _scrape("--format", "job", "--targets-path", "/x.json\u0085- job_name: evil"),
         2, want=("--targets-path",), check=_nothing_written),
    Case("scrape_config_targets_path_line_separator",
         _scrape("--format", "job", "--targets-path", "/x.json\u2028- job_name: evil"), 2, want=("--targets-path",),
         check=_nothing_written),
    Case("scrape_config_empty_job", _scrape("--format", "job", "--job", ""), 2, want=("--job",), check=_nothing_written),
    Case("scrape_config_host_latin_letter", _scrape(hostfile="hôst\n"), 2, want=("hôst", "DNS host name"),
         check=_nothing_written),
    Case("scrape_config_host_cjk", _scrape(hostfile="主机\n"), 2, want=("主机", "DNS host name"), check=_nothing_written),
    Case("scrape_config_host_arabic_indic_digits", _scrape(hostfile="٣٣\n"), 2, want=("DNS host name",),
         check=_nothing_written),
]


# ------------------------------------------------------------------------------- diagnose

def _results(tmp_path, latencies):
    lines = []
    for i, lat in enumerate(latencies):
        lines.append(json.dumps({"schema": 1, "type": "result", "ts": 1795400000.0 + i, "run_id": f"r{i}",
                                 "hosts": ["n1", "n2"], "nodes": 2, "ranks": 2, "op": "allreduce",
                                 "size_bytes": 1024, "latency_avg_us": lat, "transport": "ucx", "engine": "builtin"}))
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _diagnose(*argv, latencies=(12.0,) * 20):
    def setup(tmp_path):
        return ["diagnose", *argv, _results(tmp_path, latencies)], {}
    return setup


def _long_path(tmp_path):
    return ["diagnose", str(tmp_path / ("a" * 5000))], {}


def _short_error(out, err, ctx):
    assert "no such file" in err and len(err) < 600, len(err)


def _every_line_a_record(out, err, ctx):
    assert "40 line(s), 40 record(s)" in err and "bad line" not in err, err


DIAGNOSE = [
    Case("diagnose_since_huge_duration", _diagnose("--since", "99999999999999999999d"), 2, want=("--since", "1970")),
    Case("diagnose_since_empty", _diagnose("--since", ""), 2, want=("--since ''", "expected a duration")),
    Case("diagnose_since_non_ascii_digits", _diagnose("--since", "٣d"), 2, want=("--since",)),
    Case("diagnose_5000_character_path", _long_path, 2, check=_short_error),
    Case("diagnose_since_5000_characters", _diagnose("--since", "7" * 5000 + "x"), 2, want=("--since",),
         check=lambda out, err, ctx: len(err) < 600 or pytest.fail(f"{len(err)} characters: {err[:200]}")),
    Case("diagnose_latency_1e308_is_a_record", _diagnose(latencies=[12.0] * 20 + [1e308] * 20), 1,
         want=("1e+302 s",), check=_every_line_a_record),
]


# ------------------------------------------------------------------------------- sweep

def _sweep_big_spec(tmp_path):
    p = "/tmp/" + "p" * 996        # 1,001 characters: within a path's limit, not 100 times over
    lines = ["ranks: 2", "congestion:", "  hosts:", f"    h0: &src {{sysfs_root: {p}, netstat: {p}, ethtool_root: {p}}}"]
    lines += [f"    h{i}: *src" for i in range(1, 100)]
    (tmp_path / "c.yaml").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    return ["sweep", "--config", str(tmp_path / "c.yaml"), "--op", "allreduce", "--sizes", "1KB,4KB",
            "--iterations", "2", "--warmup", "0", "--out-dir", str(out)], {"out": out}


def _no_sweep_output(out, err, ctx):
    assert not ctx["out"].exists() or not os.listdir(ctx["out"]), os.listdir(ctx["out"])
    assert "FAILED" not in out, out


SWEEP = [
    Case("sweep_congestion_spec_past_256KB", _sweep_big_spec, 2, want=("congestion", "256 KB", "100 per-host"),
         check=_no_sweep_output),
]

CASES = LOCATE + DOCTOR + SCRAPE + DIAGNOSE + SWEEP


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input(case, tmp_path):
    argv, ctx = case.setup(tmp_path)
    rc, out, err = run(argv, case.timeout, case.mem_bytes)
    text = out + err
    assert rc != "hung", f"{case.name}: no exit within {case.timeout:g} s\n{err[-2000:]}"
    assert rc in (case.rc if isinstance(case.rc, tuple) else (case.rc,)), (rc, err[-2000:])
    assert "Traceback" not in text, err[-3000:]
    for f in case.want:
        assert f in text, (f, text[-3000:])
    for f in case.never:
        assert f not in text, (f, text[-3000:])
    if case.check is not None:
        case.check(out, err, ctx)


# Open MPI 4.1.4's stderr when ssh cannot resolve two of three hosts, as mpirun printed it here; a
# failure record keeps its last 20 lines, which start inside the first box and may or may not hold
# the ssh lines (they race with the banners)
OMPI_BANNERS = """\
ssh: Could not resolve hostname badhost1: Name or service not known
--------------------------------------------------------------------------
ORTE was unable to reliably start one or more daemons.
This usually is caused by:

* not finding the required libraries and/or binaries on
  one or more nodes. Please check your PATH and LD_LIBRARY_PATH
  settings, or configure OMPI with --enable-orterun-prefix-by-default

* lack of authority to execute on one or more specified nodes.
  Please verify your allocation and authorities.

* the inability to write startup files into /tmp (--tmpdir/orte_tmpdir_base).
  Please check with your sys admin to determine the correct location to use.

*  compilation of the orted with dynamic libraries when static are required
  (e.g., on Cray). Please check your configure cmd line and consider using
  one of the contrib/platform definitions for your system type.

* an inability to create a connection back to mpirun due to a
  lack of common network interfaces and/or no route found between
  them. Please check network connectivity (including firewalls
  and network routing requirements).
--------------------------------------------------------------------------
--------------------------------------------------------------------------
ORTE does not know how to route a message to the specified daemon
located on the indicated node:

  my node:   vm
  target node:  badhost2

This is usually an internal programming error that should be
reported to the developers. In the meantime, a workaround may
be to set the MCA param routed=direct on the command line or
in your environment. We apologize for the problem.
--------------------------------------------------------------------------
[vm:32292] 1 more process has sent help message help-errmgr-base.txt / no-path
[vm:32292] Set MCA parameter "orte_base_help_aggregate" to 0 to see all help / error messages
"""


@pytest.mark.parametrize("tail, expected", [
    (OMPI_BANNERS, "ssh: Could not resolve hostname badhost1: Name or service not known"),
    ("\n".join(OMPI_BANNERS.splitlines()[-20:]),
     "ORTE does not know how to route a message to the specified daemon located on the indicated node: (node badhost2)"),
    ("\n".join(OMPI_BANNERS.splitlines()[-20:-2]),
     "ORTE does not know how to route a message to the specified daemon located on the indicated node: (node badhost2)"),
    (OMPI_BANNERS[OMPI_BANNERS.index("-"):OMPI_BANNERS.index("-" * 74 + "\n" + "-" * 74) + 75], "ORTE was unable to reliably start one or more daemons. This usually is "
                                                 "caused by:"),
], ids=["whole", "last_20_lines", "last_20_without_help_notes", "first_box_only"])
def test_open_mpi_failure_named_by_its_cause_not_its_boilerplate(tail, expected):
    from collbench.engines.mpi_job import stderr_reason
    assert stderr_reason(tail) == expected
