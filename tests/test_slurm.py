"""`launcher: srun` and the stress loop as a Slurm job, against a real Slurm: slurmctld, one
slurmd per network-namespace host and munged, brought up by scripts/slurm_local.sh (root)."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
import yaml

from collbench import proctree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAB = os.path.join(REPO, "scripts", "slurm_local.sh")
COLLBENCH = [sys.executable, "-m", "collbench"]
NODE_DAEMONS = {"slurmd", "slurmctld", "slurmscriptd", "sshd"}

pytestmark = [pytest.mark.slow, pytest.mark.netns]


def clean_env():
    """Our environment without any Slurm job's variables: collbench must request its own."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SALLOC_", "SBATCH_", "SRUN_"))}


def run(argv, timeout=240, env=None, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env or clean_env(), **kw)


def wait_for(check, timeout, what, interval=0.5, describe=None):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            seen = f"; {describe()}" if describe else ""
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{seen}")
        time.sleep(interval)


def read_records(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def netns_processes(desc):
    """{node name: [(pid, comm, state, command line) of every process in its namespace]}."""
    out = {}
    for node in desc["nodes"]:
        res = run(["ip", "netns", "pids", node["netns"]], timeout=30)
        procs = []
        for pid in res.stdout.split():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    comm = f.read().strip()
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            procs.append((int(pid), comm, state, cmdline))
        out[node["name"]] = procs
    return out


def leftover_processes(desc):
    """{node: [process, ...]} of what runs on the nodes besides Slurm's daemons (zombies count:
    nobody reaped them)."""
    left = {n: [p for p in procs if p[1] not in NODE_DAEMONS] for n, procs in netns_processes(desc).items()}
    return {n: procs for n, procs in left.items() if procs}


def wait_for_only_daemons(desc, timeout=60):
    wait_for(lambda: not leftover_processes(desc), timeout, "the nodes to run nothing but Slurm's daemons",
             describe=lambda: f"still running: {leftover_processes(desc)}")


class Cluster:
    def __init__(self, directory):
        self.dir = directory
        with open(os.path.join(directory, "slurm.json")) as f:
            self.desc = json.load(f)
        self.config = os.path.join(directory, "collbench.yaml")
        self.env = dict(clean_env(), SLURM_CONF=os.path.join(directory, "slurm.conf"))
        self.node_names = [n["name"] for n in self.desc["nodes"]]

    def squeue(self, *args):
        res = run(["squeue", "-h", *args], env=self.env, timeout=30)
        assert res.returncode == 0, res.stderr
        return res.stdout

    def active_jobs(self):
        return [ln for ln in self.squeue("-o", "%i %T").splitlines() if ln.strip()]

    def log_lines(self, job_id):
        """The lines of slurmctld's and every slurmd's log that name a job, for a failure's message."""
        found = []
        for log in [os.path.join(self.dir, "ctld", "slurmctld.log"),
                    *(os.path.join(self.dir, "nodes", n, "slurmd.log") for n in self.node_names)]:
            try:
                with open(log, errors="replace") as f:
                    found += [f"{os.path.basename(log)}: {ln.rstrip()}" for ln in f if f"JobId={job_id}" in ln
                              or f"job {job_id}" in ln.lower() or f"[{job_id}." in ln or "error" in ln.lower()]
            except OSError as e:
                found.append(f"{log}: {e}")
        return "\n".join(found[-40:])

    def jobs_and_processes(self):
        """What squeue and the nodes show, for a failed wait's message."""
        return (f"squeue: {self.squeue('-o', '%i %T %r %M %N %j').strip() or 'empty'}; "
                f"processes besides Slurm's daemons: {leftover_processes(self.desc)}")

    def config_with(self, tmp_path, name, **changes):
        with open(self.config) as f:
            data = yaml.safe_load(f)
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = dict(data[key], **value)
            else:
                data[key] = value
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data))
        return str(path)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    assert os.geteuid() == 0, "the Slurm tests need root (namespaces, munged, slurmd)"
    # short: slurmstepd's socket paths live under it (pytest's own temp paths can be too long)
    directory = os.path.join(tempfile.mkdtemp(prefix="cbslt", dir="/tmp"), "cluster")
    res = run([LAB, "up", directory, "--nodes", "3", "--prefix", "cbslt"], timeout=180)
    try:
        assert res.returncode == 0, res.stderr
        c = Cluster(directory)
        yield c
    finally:
        down = run([LAB, "down", directory], timeout=180)
        assert down.returncode == 0, down.stderr
    assert not os.path.exists(directory)
    os.rmdir(os.path.dirname(directory))
    listed = run(["ip", "netns", "list"]).stdout
    assert not any(n["netns"] in listed for n in c.desc["nodes"])
    assert not [d for d in c.desc["daemons"] if still_running(d)]


def still_running(daemon):
    """The daemon `up` started is still running (a zombie waiting for its reaper is not)."""
    return proctree.same_process(daemon["pid"], daemon["start"])


def test_cluster_has_separate_hosts_and_a_partition(cluster):
    out = run(["sinfo", "-h", "-N", "-o", "%N %P %T"], env=cluster.env, timeout=30)
    rows = sorted(line.split() for line in out.stdout.splitlines())
    assert rows == sorted([n, "debug*", "idle"] for n in cluster.node_names)
    res = run(["srun", "-N", "3", "-n", "3", "hostname"], env=cluster.env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.split()) == sorted(cluster.node_names)   # each node is its own host


@pytest.mark.parametrize("ranks", [2, 4])
def test_once_via_srun_from_outside_an_allocation(cluster, tmp_path, ranks):
    results = tmp_path / "r.jsonl"
    res = run(COLLBENCH + ["once", "--config", cluster.config, "--np", str(ranks), "--ops", "allreduce,bcast",
                           "--sizes", "1KB,16KB", "--iterations", "10", "--validate", "--results", str(results)])
    assert res.returncode == 0, res.stdout + res.stderr
    recs = read_records(results)
    assert len(recs) == 4 and all(r["type"] == "result" and r["validation"] == "pass" for r in recs)
    hosts = recs[0]["hosts"]
    assert len(hosts) == 2 and set(hosts) <= set(cluster.node_names), hosts   # slurm.nodes: 2
    assert all(r["hosts"] == hosts and r["nodes"] == 2 and r["ranks"] == ranks for r in recs)
    assert "Open MPI" in recs[0]["mpi"]
    # the allocation was Slurm's: a finished job of `ranks` tasks on exactly those nodes
    jobs = cluster.squeue("--states=all", "-o", "%i|%D|%N|%T").splitlines()
    expanded = {}
    for line in jobs:
        job_id, nnodes, nodelist, state = line.split("|")
        names = run(["scontrol", "show", "hostnames", nodelist], env=cluster.env, timeout=30).stdout.split()
        expanded[job_id] = (set(names), state)
    assert any(names == set(hosts) and state == "COMPLETED" for names, state in expanded.values())
    assert not cluster.active_jobs()


def test_once_inside_salloc_uses_the_allocation(cluster, tmp_path):
    results = tmp_path / "r.jsonl"
    probe = ("echo NODES=$SLURM_JOB_NODELIST; exec " + " ".join(COLLBENCH)
             + f" once --config {cluster.config} --np 3 --ops allreduce --sizes 4KB --iterations 10"
             + f" --results {results}")
    res = run(["salloc", "-N", "3", "-n", "3", "sh", "-c", probe], env=cluster.env, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    nodelist = re.search(r"NODES=(\S+)", res.stdout).group(1)
    alloc = run(["scontrol", "show", "hostnames", nodelist], env=cluster.env, timeout=30).stdout.split()
    (rec,) = read_records(results)
    assert rec["type"] == "result" and sorted(rec["hosts"]) == sorted(alloc) and rec["nodes"] == 3


def test_once_via_srun_records_and_prints_srun_and_its_slurm_job(cluster, tmp_path):
    """Issue 19: with launcher: srun, `once` said only `mpirun (Open MPI) ...` (the MPI). The
    records and the header name the launcher and the Slurm job: the one srun made outside an
    allocation (as the ranks report it), the allocation's inside salloc."""
    results = tmp_path / "r.jsonl"
    res = run(COLLBENCH + ["once", "--config", cluster.config, "--np", "2", "--ops", "allreduce",
                           "--sizes", "1KB", "--iterations", "10", "--results", str(results)])
    assert res.returncode == 0, res.stdout + res.stderr
    (rec,) = read_records(results)
    assert rec["launcher"] == "srun" and rec["slurm_job_id"].isdigit(), rec
    header = res.stdout.splitlines()[0]
    assert f"launched by srun (Slurm job {rec['slurm_job_id']})" in header, header
    states = dict(line.split("|") for line in cluster.squeue("--states=all", "-o", "%i|%T").splitlines())
    assert states.get(rec["slurm_job_id"]) == "COMPLETED", states

    inside = tmp_path / "inside.jsonl"
    probe = ("echo JOB=$SLURM_JOB_ID; exec " + " ".join(COLLBENCH)
             + f" once --config {cluster.config} --np 2 --ops allreduce --sizes 1KB --iterations 10"
             + f" --results {inside}")
    res = run(["salloc", "-N", "2", "-n", "2", "sh", "-c", probe], env=cluster.env, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    job = re.search(r"JOB=(\d+)", res.stdout).group(1)
    (rec,) = read_records(inside)
    assert (rec["launcher"], rec["slurm_job_id"]) == ("srun", job), rec
    assert f"launched by srun (Slurm job {job})" in res.stdout


def test_once_inside_sbatch(cluster, tmp_path):
    results = tmp_path / "r.jsonl"
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec " + " ".join(COLLBENCH) + f" once --config {cluster.config} --np 4"
                      f" --ops bcast --sizes 1KB --iterations 10 --results {results}\n")
    # sbatch --wait polls the job at growing intervals (2 s, then 8 s ...): a job done in 3 s
    # returned after 10. squeue every 0.3 s instead; COMPLETED is what --wait's exit 0 said
    # (the job script exited 0), and finished jobs stay listed for MinJobAge (600 s)
    res = run(["sbatch", "--parsable", "-N", "2", "-n", "4", "-o", str(tmp_path / "out-%j"), str(script)],
              env=cluster.env, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    job = res.stdout.strip().split(";")[0]

    def state():
        return dict(line.split("|") for line in cluster.squeue("--states=all", "-o", "%i|%T").splitlines()).get(job)
    try:
        wait_for(lambda: state() not in (None, "PENDING", "CONFIGURING", "RUNNING", "COMPLETING"), 240,
                 f"job {job} to end", interval=0.3, describe=cluster.jobs_and_processes)
    finally:
        if state() in ("PENDING", "CONFIGURING", "RUNNING"):
            run(["scancel", job], env=cluster.env, timeout=30)
    assert state() == "COMPLETED", (state(), cluster.log_lines(job),
                                    "".join(p.read_text() for p in tmp_path.glob("out-*")))
    (rec,) = read_records(results)
    assert rec["type"] == "result" and rec["ranks"] == 4 and len(rec["hosts"]) == 2
    assert set(rec["hosts"]) <= set(cluster.node_names)


def test_mca_and_ucx_settings_reach_the_ranks(cluster, tmp_path):
    """The ranks run what the config says: UCX over TCP works; the same job with UCX_TLS
    without tcp, or with the MCA btl limited to self, cannot connect its hosts and fails."""
    args = ["once", "--np", "2", "--ops", "allreduce", "--sizes", "1KB", "--iterations", "5"]
    ok = cluster.config_with(tmp_path, "ucx.yaml", transport="ucx-tcp", env={"UCX_TLS": "tcp,self"})
    res = run(COLLBENCH + args + ["--config", ok])
    assert res.returncode == 0, res.stdout + res.stderr
    no_tcp = cluster.config_with(tmp_path, "ucx-self.yaml", transport="ucx-tcp", env={"UCX_TLS": "self"},
                                 step_timeout=60)
    res = run(COLLBENCH + args + ["--config", no_tcp])
    assert res.returncode == 1 and "FAILED" in res.stdout, res.stdout + res.stderr
    self_only = cluster.config_with(tmp_path, "btl-self.yaml", transport="none",
                                    env={"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self"}, step_timeout=60)
    res = run(COLLBENCH + args + ["--config", self_only])
    assert res.returncode == 1 and "FAILED" in res.stdout, res.stdout + res.stderr
    wait_for(lambda: not cluster.active_jobs(), 60, "the failed jobs to leave squeue",
             describe=cluster.jobs_and_processes)
    wait_for_only_daemons(cluster.desc)   # a failed step leaves no rank behind on any node


# ---------------------------------------------------------------- the stress loop as a Slurm job

PLAN = [{"op": "allreduce", "sizes": ["1KB"], "iterations": 10}, {"op": "bcast", "sizes": ["1KB"], "iterations": 10}]


def stress(cluster, config, *args, timeout=240):
    return run(COLLBENCH + ["stress", *args, "--config", config], env=cluster.env, timeout=timeout)


def stress_config(cluster, tmp_path, name, **slurm):
    return cluster.config_with(tmp_path, name, plan=PLAN, state_dir=str(tmp_path / f"state-{name}"),
                               stress={"stop_grace": 10, "backoff_initial": 2}, slurm=slurm)


def test_stress_job_start_status_stop_leaves_nothing(cluster, tmp_path):
    config = stress_config(cluster, tmp_path, "loop.yaml")
    log = str(tmp_path / "state-loop.yaml" / "results.jsonl")
    res = stress(cluster, config, "start", "--scheduler", "slurm")
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        job_id = re.search(r"Slurm job (\d+)", res.stdout).group(1)
        wait_for(lambda: sum(r["type"] == "result" for r in read_records(log)) >= 4, 120, "results")
        st = stress(cluster, config, "status", "--json")
        assert st.returncode == 0, st.stdout + st.stderr
        info = json.loads(st.stdout)
        assert (info["state"], info["scheduler"], info["job_id"], info["squeue"]["state"]) == \
            ("running", "slurm", job_id, "RUNNING")
        text = stress(cluster, config, "status")
        assert text.returncode == 0 and f"running as Slurm job {job_id}" in text.stdout and "allreduce" in text.stdout
        hosts = {tuple(r["hosts"]) for r in read_records(log) if r["type"] == "result"}
        assert len(hosts) == 1 and len(next(iter(hosts))) == 2 and set(next(iter(hosts))) <= set(cluster.node_names)
        again = stress(cluster, config, "start", "--scheduler", "slurm")
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        stop = stress(cluster, config, "stop")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "stopped" in stop.stdout
    wait_for(lambda: not cluster.active_jobs(), 60, "the job to leave squeue", describe=cluster.jobs_and_processes)
    wait_for_only_daemons(cluster.desc)
    recs = read_records(log)
    events = [r for r in recs if r["type"] == "event"]
    assert [e["event"] for e in events][-2:] == ["stop", "job_end"]
    assert events[-2]["detail"] == "signal SIGTERM"
    assert (events[-1]["reason"], events[-1]["job_id"], events[-1]["recorded_by"]) == ("stopped", job_id, "the job script")
    st = stress(cluster, config, "status")
    assert st.returncode == 3 and f"Slurm job {job_id} ended by `collbench stress stop`" in st.stdout
    st = stress(cluster, config, "stop")
    assert st.returncode == 0 and "not running" in st.stdout


def test_stress_job_killed_by_its_time_limit_is_recorded_as_such(cluster, tmp_path):
    config = stress_config(cluster, tmp_path, "limit.yaml", time_limit="1m", signal_before="20s")
    log = str(tmp_path / "state-limit.yaml" / "results.jsonl")
    res = stress(cluster, config, "start", "--scheduler", "slurm")
    assert res.returncode == 0, res.stdout + res.stderr
    job_id = re.search(r"Slurm job (\d+)", res.stdout).group(1)
    try:
        # Slurm checks limits about every 30 s and warns up to a minute early: well within 3 minutes
        wait_for(lambda: job_id not in " ".join(cluster.active_jobs()), 180, "Slurm to end the job")
    finally:
        if job_id in " ".join(cluster.active_jobs()):
            run(["scancel", job_id], env=cluster.env, timeout=30)
    st = stress(cluster, config, "status")
    assert st.returncode == 1, st.stdout + st.stderr
    assert f"Slurm job {job_id} ended by Slurm's time limit" in st.stdout
    events = [r for r in read_records(log) if r["type"] == "event"]
    assert events[-1]["event"] == "job_end" and events[-1]["reason"] == "time_limit", events[-1]
    assert "stop" in [e["event"] for e in events]    # the daemon stopped cleanly before the limit's SIGKILL
    assert sum(r["type"] == "result" for r in read_records(log)) > 0
    wait_for_only_daemons(cluster.desc)


def test_stress_job_on_a_failed_node_is_recorded_as_such(cluster, tmp_path):
    config = stress_config(cluster, tmp_path, "nodefail.yaml")
    log = str(tmp_path / "state-nodefail.yaml" / "results.jsonl")
    res = stress(cluster, config, "start", "--scheduler", "slurm")
    assert res.returncode == 0, res.stdout + res.stderr
    job_id = re.search(r"Slurm job (\d+)", res.stdout).group(1)
    nodelist = cluster.squeue("-j", job_id, "-o", "%N").strip()
    node = run(["scontrol", "show", "hostnames", nodelist], env=cluster.env, timeout=30).stdout.split()[-1]
    try:
        down = run(["scontrol", "update", f"nodename={node}", "state=down", "reason=collbench-test"],
                   env=cluster.env, timeout=30)
        assert down.returncode == 0, down.stderr
        wait_for(lambda: job_id not in " ".join(cluster.active_jobs()), 90, "Slurm to end the job")
    finally:
        run(["scancel", job_id], env=cluster.env, timeout=30)
        run(["scontrol", "update", f"nodename={node}", "state=resume"], env=cluster.env, timeout=30)
    st = stress(cluster, config, "status", "--json")
    info = json.loads(st.stdout)
    assert st.returncode == 1 and info["state"] == "crashed" and info["ended"]["reason"] == "node_fail", info["ended"]
    events = [r for r in read_records(log) if r["type"] == "event"]
    assert events[-1]["event"] == "job_end" and events[-1]["reason"] == "node_fail"
    wait_for(lambda: "idle" in run(["sinfo", "-h", "-n", node, "-o", "%T"], env=cluster.env).stdout, 60,
             f"{node} to be back")


def test_lab_up_refuses_a_directory_too_long_for_slurms_sockets(tmp_path):
    directory = "/tmp/" + "d" * 60
    res = run([LAB, "up", directory, "--nodes", "2", "--prefix", "cbsll"], timeout=60)
    assert res.returncode == 1 and "too long for slurmstepd's socket paths" in res.stderr, res.stderr
    assert "at most 44 characters" in res.stderr and not os.path.exists(directory)


def test_lab_down_is_idempotent_and_leaves_nothing(tmp_path):
    directory = os.path.join(tempfile.mkdtemp(prefix="cbsld", dir="/tmp"), "one")
    res = run([LAB, "up", directory, "--nodes", "1", "--prefix", "cbsld"], timeout=180)
    assert res.returncode == 0, res.stderr
    with open(os.path.join(directory, "slurm.json")) as f:
        desc = json.load(f)
    assert os.path.isfile(os.path.join(directory, "collbench.yaml"))
    assert yaml.safe_load(open(os.path.join(directory, "collbench.yaml")))["launcher"] == "srun"
    assert run([LAB, "down", directory], timeout=120).returncode == 0
    assert not os.path.exists(directory)
    assert desc["nodes"][0]["netns"] not in run(["ip", "netns", "list"]).stdout
    assert not [d["what"] for d in desc["daemons"] if still_running(d)]
    again = run([LAB, "down", directory], timeout=60)
    assert again.returncode == 0 and "nothing to remove" in again.stderr
    os.rmdir(os.path.dirname(directory))
    assert shutil.which("munged")   # what the lab needs is installed (scripts/install.sh)


def test_status_survives_a_damaged_job_file_and_a_job_slurm_never_knew(cluster, tmp_path):
    config = stress_config(cluster, tmp_path, "damaged.yaml")
    state = tmp_path / "state-damaged.yaml"
    state.mkdir()
    (state / "slurm-job.json").write_text(json.dumps({"job_id": "999999", "ended": "garbage", "argv": 7}))
    st = stress(cluster, config, "status")
    assert st.returncode == 1 and "ended by an end nobody recorded" in st.stdout, st.stdout + st.stderr
    (rec,) = read_records(str(state / "results.jsonl"))
    assert (rec["event"], rec["reason"], rec["job_id"], rec["recorded_by"]) == \
        ("job_end", "unknown", "999999", "collbench stress status")
    again = stress(cluster, config, "status")       # recorded once, not on every status
    assert again.returncode == 1 and len(read_records(str(state / "results.jsonl"))) == 1
    (state / "slurm-job.json").write_text("{not json")
    st = stress(cluster, config, "status")           # not a job file: the local daemon's status
    assert st.returncode == 3 and "Slurm" not in st.stdout, st.stdout + st.stderr


def test_hostlists_srun_options_and_time_limits(monkeypatch, tmp_path):
    from collbench import slurm
    from collbench.config import build_config
    assert slurm.expand_hostlist("n[1-3,05],gpu7,r[1-2]c[1-2]") == \
        ["n1", "n2", "n3", "n05", "gpu7", "r1c1", "r1c2", "r2c1", "r2c2"]
    assert slurm.expand_hostlist("cbslm-ab12-h[01-02]") == ["cbslm-ab12-h01", "cbslm-ab12-h02"]
    for bad in ("n[1-", "n]1[", "n[3-1]", "n[a-b]", "n[1-9999999]"):
        with pytest.raises(ValueError):
            slurm.expand_hostlist(bad)
    assert [slurm.time_option(s) for s in (1, 60, 61, 3600)] == ["1", "1", "2", "60"]
    cfg = build_config({"launcher": "srun", "launcher_path": "true", "ranks": 4,
                        "slurm": {"partition": "p1", "account": "a1", "time_limit": "90s", "nodes": 8,
                                  "srun_args": ["--exclusive"]}}, "<t>", str(tmp_path))
    for k in ("SLURM_JOB_ID", "SLURM_JOBID"):
        monkeypatch.delenv(k, raising=False)
    outside = slurm.srun_options(cfg, 4)
    assert outside == ["--mpi=pmix", "--kill-on-bad-exit=1", "--nodes", "4", "--partition", "p1",
                       "--account", "a1", "--time", "2", "--exclusive"]
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "x[1-3]")
    assert slurm.srun_options(cfg, 4) == ["--mpi=pmix", "--kill-on-bad-exit=1", "--exclusive"]
    assert slurm.planned_hosts(cfg, 2) == ["x1", "x2"]
