"""The stress loop as a Slurm job: `stress start|stop|status --scheduler slurm` and `stress job-end`.

start    sbatch deploy/slurm/collbench-stress.sbatch (it runs `collbench stress run` in the
         allocation) with the config's slurm section; the job id goes to <state_dir>/slurm-job.json;
         waits (bounded) until the daemon in the job has written its state
stop     scancel --batch --signal=TERM (the job script passes it to the daemon, which stops its
         MPI job and writes its stop record), wait; then scancel (Slurm's SIGTERM, KillWait,
         SIGKILL), wait; then scancel --signal=KILL --full. Every wait is bounded.
status   squeue's view of the job combined with the daemon's state file and results log
job-end  run by the job script after the daemon exits: why did the job end (our stop, Slurm's
         time limit or its warning signal, a scancel, a node failure, the daemon itself)? One
         `job_end` event in the results log and in slurm-job.json says so.

A job that ends without running job-end (node failure, SIGKILL, cancelled while pending) is
noticed by the next `status` or `stop` through squeue (or the job's absence from it: Slurm forgets
finished jobs after MinJobAge, and no sacct is needed) and recorded then, once.

The state directory must be shared between the submitting host and the job's first node (as
the results log must be for the exporter); a pid is meaningless across hosts, so status trusts
squeue and the state file, never /proc.
"""

import fcntl
import json
import os
import shutil
import sys
import time

from collbench import slurm
from collbench.results import records
from collbench.errors import UserError
from collbench.results.results_log import ResultsLog
from collbench.results.state_dir import (RUNNING, STATUS_EXIT, DaemonStatus, daemon_status, read_state,
                                         write_json_atomic)
from collbench.stress.backend import Backend
from collbench.tables import format_duration
from collbench.stress.resolve import resolve
from collbench.stress.status import last_results, render_status

JOB_FILE = "slurm-job.json"       # the submitted job: id, submitted, argv; `ended` once it ended
STOP_FILE = "slurm-stop.json"     # written by `stop` before it signals: job-end says "stopped"
JOB_LOCK = "slurm-job.lock"       # one writer of the job_end record
JOB_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "deploy", "slurm", "collbench-stress.sbatch")

ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
          "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "REQUEUE_FED", "REQUEUE_HOLD")
# squeue's final state -> (reason key, words)
FINAL_REASONS = {
    "TIMEOUT": ("time_limit", "Slurm's time limit"),
    "DEADLINE": ("deadline", "Slurm's deadline"),
    "NODE_FAIL": ("node_fail", "a node failure"),
    "BOOT_FAIL": ("node_fail", "a node boot failure"),
    "PREEMPTED": ("preempted", "preemption"),
    "OUT_OF_MEMORY": ("out_of_memory", "running out of memory"),
    "CANCELLED": ("cancelled", "scancel (not through collbench)"),
    "FAILED": ("failed", "the job script failing"),
    "COMPLETED": ("exited", "the job script exiting"),
}
# squeue's reason while a job completes -> the state it will end in
REASON_STATES = {"TimeLimit": "TIMEOUT", "NodeDown": "NODE_FAIL", "DeadLine": "DEADLINE",
                 "OutOfMemory": "OUT_OF_MEMORY"}
# Slurm's --signal warning may come up to a minute before the requested time (its resolution)
SIGNAL_RESOLUTION = 60.0


def add_arguments(start, stop, status):
    for v in (start, stop, status):
        v.add_argument("--scheduler", choices=("none", "slurm"), default=None,
                       help="slurm: the loop runs as a Slurm job (sbatch) instead of a local daemon "
                            "(default: the config's slurm.stress_job for start; stop and status "
                            "follow what start did)")


def register(verbs, verb):
    v = verb("job-end", cmd_job_end, "record why a Slurm stress job ended (run by its job script)")
    v.add_argument("--exit-code", type=int, default=None, help="the daemon's exit code")
    v.add_argument("--signal", default=None, help="the signal the job script received (TERM, USR1, ...)")


class SlurmJob(Backend):
    """The stress loop as a Slurm job (one per state directory, recorded in slurm-job.json)."""

    name = "slurm"

    def __init__(self, job=None):
        self.job = job

    @classmethod
    def select(cls, verb, args, cfg, paths):
        """This backend when `verb` is the Slurm job's business, else None (the local daemon's)."""
        choice = getattr(args, "scheduler", None)
        job = read_job(paths.state_dir)
        if verb == "start":
            if choice == "slurm" or (choice is None and slurm.settings(cfg).stress_job):
                return cls(job)
            if job:   # a local daemon from now on: stop and status must not follow the old job
                info = _query(job, cfg)
                if not job.get("ended") and _active(info):
                    raise UserError(f"Slurm job {job['job_id']} runs the stress loop of {paths.state_dir}: "
                                    "stop it first (collbench stress stop), or choose another --state-dir")
                if not job.get("ended"):
                    _record_end(cfg, paths, job, info, by="collbench stress start")
                os.replace(os.path.join(paths.state_dir, JOB_FILE), os.path.join(paths.state_dir, JOB_FILE + ".old"))
            return None
        if choice == "none" or (choice is None and not job):
            return None
        return cls(job)

    def start(self, args, cfg, paths):
        return start(args, cfg, paths)

    def stop(self, args, cfg, paths):
        return stop(args, cfg, paths, self.job) if self.job else self._no_job(paths)

    def status(self, args, cfg, paths):
        return status(args, cfg, paths, self.job) if self.job else self._no_job(paths)

    @staticmethod
    def _no_job(paths):
        print(f"collbench stress: no Slurm job was started from {paths.state_dir} ({JOB_FILE} missing)",
              file=sys.stderr)
        return STATUS_EXIT["stopped"]


# ---------------------------------------------------------------- files

def read_job(state_dir):
    try:
        with open(os.path.join(state_dir, JOB_FILE), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("job_id"), str) or not data["job_id"].isdigit():
        return None
    if not isinstance(data.get("ended"), dict):   # a damaged file: its job's end is not known yet
        data["ended"] = None
    return data


def _write_job(state_dir, job):
    write_json_atomic(os.path.join(state_dir, JOB_FILE), job)


def _remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _query(job, cfg):
    return slurm.job_info(job["job_id"], cfg)


def _active(info):
    return info is not None and info["state"] in ACTIVE


# ---------------------------------------------------------------- start

def _collbench_command():
    """The collbench the job should run: the one running now (same venv), else PATH's."""
    here = os.path.join(os.path.dirname(sys.executable), "collbench")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("collbench")
    if found:
        return os.path.abspath(found)
    raise UserError("cannot find the collbench command to run in the job (not beside "
                    f"{sys.executable}, not on PATH)")


def sbatch_command(cfg, paths, script=JOB_SCRIPT):
    s = slurm.settings(cfg)
    argv = ["sbatch", "--parsable", "--job-name", s.job_name,
            "--output", os.path.join(paths.state_dir, "slurm-%j.out"), "--open-mode=append",
            "--chdir", paths.state_dir, "--ntasks", str(cfg.ranks),
            # a requeued job would restart the loop behind stop's and status's back
            "--no-requeue"]
    if s.nodes:
        argv += ["--nodes", str(min(s.nodes, cfg.ranks))]
    if cfg.ranks_per_node:
        argv += ["--ntasks-per-node", str(cfg.ranks_per_node)]
    if s.partition:
        argv += ["--partition", s.partition]
    if s.account:
        argv += ["--account", s.account]
    if s.time_limit:
        argv += ["--time", slurm.time_option(s.time_limit)]
    argv += [f"--signal=B:TERM@{max(1, int(round(s.signal_before)))}",
             f"--export=ALL,COLLBENCH={_collbench_command()}"]
    argv += list(s.sbatch_args)
    argv.append(script)
    if os.path.isfile(cfg.source):
        argv.append(os.path.abspath(cfg.source))
    else:
        argv.append("")        # the embedded default config
    argv.append(paths.state_dir)
    return argv


def start(args, cfg, paths):
    paths.ensure()
    job = read_job(paths.state_dir)
    if job and not job.get("ended"):
        info = _query(job, cfg)
        if _active(info):
            print(f"collbench stress: already running as Slurm job {job['job_id']} ({info['state']}); "
                  "not submitting a second one", file=sys.stderr)
            return 1
        _record_end(cfg, paths, job, info, by="collbench stress start")
    st = daemon_status(paths)
    if st.state == RUNNING:
        print(f"collbench stress: a local daemon runs in {paths.state_dir} (pid {st.pid}); stop it first",
              file=sys.stderr)
        return 1
    if not os.path.isfile(JOB_SCRIPT):
        raise UserError(f"the job script {JOB_SCRIPT} is missing (it ships in collbench's deploy/slurm/)")
    if cfg.launcher != "srun":
        print("collbench stress: note: launcher is not srun; inside the job mpirun starts the ranks "
              "through Slurm's own plm", file=sys.stderr)
    argv = sbatch_command(cfg, paths)
    _remove(os.path.join(paths.state_dir, STOP_FILE))
    before = (read_state(paths) or {}).get("token")
    submitted = time.time()
    res = slurm.run(argv, cfg)
    job_id = res.stdout.strip().split(";")[0] if res.returncode == 0 else ""
    if not job_id.isdigit():
        print(f"collbench stress: sbatch failed: {(res.stderr or res.stdout).strip()}", file=sys.stderr)
        return 1
    job = {"job_id": job_id, "submitted": submitted, "argv": argv, "config": cfg.source,
           "state_dir": paths.state_dir, "results_log": paths.results_log, "ended": None,
           "output": os.path.join(paths.state_dir, f"slurm-{job_id}.out")}
    _write_job(paths.state_dir, job)
    deadline = time.monotonic() + max(0.0, args.wait)
    info = None
    while True:
        info = _query(job, cfg)
        state = read_state(paths) or {}
        if (info and info["state"] == "RUNNING" and state.get("token") and state.get("token") != before
                and state.get("status") not in (None, "stopped")):
            print(f"collbench stress: started as Slurm job {job_id} on {info['nodes']} "
                  f"(daemon pid {state.get('pid')} there, {cfg.ranks} ranks, time limit {info['time_limit']})")
            print(f"  results: {paths.results_log}")
            print(f"  logs:    {job['output']}, {paths.mpi_output}")
            return 0
        if not _active(info):
            break
        if time.monotonic() > deadline:
            print(f"collbench stress: submitted Slurm job {job_id}; it is {info['state'].lower()} "
                  f"({info['reason']}) after {args.wait:g}s: `collbench stress status` follows it")
            return 0
        time.sleep(0.5)
    end = _record_end(cfg, paths, read_job(paths.state_dir) or job, info, by="collbench stress start")
    print(f"collbench stress: Slurm job {job_id} ended before the daemon came up: {end['detail']}",
          file=sys.stderr)
    tail = _tail(job["output"])
    if tail:
        print(tail, file=sys.stderr)
    return 1


def _tail(path, n=2000):
    try:
        with open(path, errors="replace") as f:
            f.seek(max(0, os.path.getsize(path) - n))
            return f.read().strip()
    except OSError:
        return ""


# ---------------------------------------------------------------- stop

def stop(args, cfg, paths, job):
    job_id = job["job_id"]
    info = _query(job, cfg)
    if not _active(info):
        end = job.get("ended") or _record_end(cfg, paths, job, info, by="collbench stress stop")
        print(f"collbench stress: not running (Slurm job {job_id} ended: {end['detail']})")
        return 0
    t0 = time.monotonic()
    write_json_atomic(os.path.join(paths.state_dir, STOP_FILE),
                      {"job_id": job_id, "time": time.time(), "by": "collbench stress stop"})
    if info["state"] == "PENDING":
        _scancel(cfg, [job_id])
        _wait_inactive(job, cfg, 30.0)
        end = _record_end(cfg, paths, job, _query(job, cfg), by="collbench stress stop",
                          reason=("stopped", "cancelled by `collbench stress stop` before it started"))
        print(f"collbench stress: cancelled pending Slurm job {job_id}: {end['detail']}")
        return 0
    grace = cfg.stress.stop_grace + 30.0   # the daemon gives its MPI job stop_grace, then writes its records
    _scancel(cfg, ["--batch", "--signal=TERM", job_id])
    how = "the daemon stopped"
    if not _wait_inactive(job, cfg, grace):
        print(f"collbench stress: Slurm job {job_id} still running {grace:.0f}s after SIGTERM: scancel",
              file=sys.stderr)
        how = "cancelled after the grace period"
        _scancel(cfg, [job_id])
        if not _wait_inactive(job, cfg, 120.0):
            how = "killed"
            _scancel(cfg, ["--signal=KILL", "--full", job_id])
            if not _wait_inactive(job, cfg, 60.0):
                print(f"collbench stress: Slurm job {job_id} would not end (squeue: {_query(job, cfg)})",
                      file=sys.stderr)
                return 1
    job = read_job(paths.state_dir) or job
    end = job.get("ended") or _record_end(cfg, paths, job, _query(job, cfg), by="collbench stress stop",
                                          reason=("stopped", f"stopped by `collbench stress stop` ({how})"))
    print(f"collbench stress: stopped (Slurm job {job_id}, {how}, {time.monotonic() - t0:.1f}s)")
    return 0


def _scancel(cfg, argv):
    res = slurm.run(["scancel"] + argv, cfg)
    if res.returncode != 0 and "already completing or completed" not in (res.stderr or ""):
        print(f"collbench stress: scancel {' '.join(argv)}: {(res.stderr or '').strip()}", file=sys.stderr)
    return res.returncode == 0


def _wait_inactive(job, cfg, timeout):
    """Wait until the job has left RUNNING/COMPLETING (or Slurm forgot it); True if it did."""
    deadline = time.monotonic() + timeout
    while True:
        info = _query(job, cfg)
        if not _active(info):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


# ---------------------------------------------------------------- status

def status(args, cfg, paths, job):
    try:
        info = _query(job, cfg)
    except UserError as e:   # slurmctld down or unreachable: say so, record nothing
        print(f"collbench stress: Slurm job {job['job_id']}: state unknown: {e}", file=sys.stderr)
        return 4
    state_file = read_state(paths) or {}
    if not _active(info) and not job.get("ended"):
        job = dict(job, ended=_record_end(cfg, paths, job, info, by="collbench stress status"))
    ended = job.get("ended")
    if _active(info):
        state = "running" if info["state"] in ("RUNNING", "COMPLETING", "CONFIGURING") else "pending"
    else:
        # stopped through collbench: like a clean stop (3); anything Slurm or a failure did: 1
        state = "stopped" if ended and ended.get("reason") == "stopped" else "crashed"
    code = {"running": 0, "pending": 3, "stopped": 3, "crashed": 1}[state]
    results = state_file.get("results_log") or paths.results_log
    last = last_results(results)
    if args.json:
        print(json.dumps({"state": state, "scheduler": "slurm", "job_id": job["job_id"], "squeue": info,
                          "ended": ended, "state_dir": paths.state_dir, "results_log": results,
                          "iteration": state_file.get("iteration"), "daemon": state_file,
                          "last_results": last["results"], "last_failure": last["failure"],
                          "bad_lines": last["bad_lines"]}, indent=1, sort_keys=True))
        return code
    now = time.time()
    if state in ("running", "pending"):
        lines = [f"collbench stress: {state} as Slurm job {job['job_id']} ({info['state']}"
                 + (f", {info['reason']}" if info["reason"] not in ("None", "") else "")
                 + f"; nodes {info['nodes'] or '-'}, {info['time_used']} of {info['time_limit']})"]
        if state == "running" and isinstance(state_file.get("updated"), (int, float)):
            lines.append(f"  daemon (state file): {state_file.get('status', '?')}, iteration "
                         f"{state_file.get('iteration', 0)}, mode {state_file.get('mode')}, relaunches "
                         f"{state_file.get('relaunches', 0)}, updated {format_duration(now - state_file['updated'])} ago")
    else:
        lines = [f"collbench stress: {'stopped' if state == 'stopped' else 'ended'}: Slurm job "
                 f"{job['job_id']} ended by {ended.get('detail')}"]
        when = ended.get("time") if isinstance(ended.get("time"), (int, float)) else now
        lines.append(f"  recorded {format_duration(now - when)} ago by {ended.get('by')}; "
                     f"Slurm state {ended.get('slurm_state') or 'unknown (no longer in squeue)'}; daemon last at "
                     f"iteration {state_file.get('iteration', 0)} ({state_file.get('status', '?')})")
    st = DaemonStatus("running" if state == "running" else "stopped", state_file.get("pid"), "", state_file)
    daemon_lines = render_status(st, paths, results, last, [])
    first = next((i for i, ln in enumerate(daemon_lines) if ln.startswith("  state dir")), 0)
    lines += daemon_lines[first:]
    print("\n".join(lines))
    return code


# ---------------------------------------------------------------- job end

def cmd_job_end(args):
    cfg, paths = resolve(args)
    job_id = slurm.in_allocation()
    if not job_id:
        raise UserError("stress job-end: not inside a Slurm job (SLURM_JOB_ID unset); the job script runs it")
    job = read_job(paths.state_dir)
    if not job or job["job_id"] != job_id:   # submitted by hand with sbatch: adopt it
        job = {"job_id": job_id, "submitted": None, "argv": None, "config": cfg.source,
               "state_dir": paths.state_dir, "results_log": paths.results_log, "ended": None,
               "output": None}
        _write_job(paths.state_dir, job)
    try:
        info = _query(job, cfg)
    except UserError as e:
        info = None
        print(f"collbench stress job-end: {e}", file=sys.stderr)
    end = _record_end(cfg, paths, job, info, by="the job script", signal=args.signal, exit_code=args.exit_code)
    print(f"collbench stress: Slurm job {job_id} ended by {end['detail']}")
    return 0


def _reason(cfg, paths, job, info, signal=None, exit_code=None):
    """(reason key, words) for how the job ended, from our stop request and squeue."""
    stop_req = None
    try:
        with open(os.path.join(paths.state_dir, STOP_FILE), encoding="utf-8") as f:
            stop_req = json.load(f)
    except (OSError, ValueError):
        pass
    if isinstance(stop_req, dict) and str(stop_req.get("job_id")) == job["job_id"]:
        return "stopped", "`collbench stress stop`"
    state = info["state"] if info else None
    if info and state in ("COMPLETING", "RUNNING") and info["reason"] in REASON_STATES:
        state = REASON_STATES[info["reason"]]   # while completing, the reason says what is ending it
    if state in FINAL_REASONS and state != "COMPLETED":
        return FINAL_REASONS[state]
    if signal and info and _active(info):
        left = _seconds(info["time_left"])
        used, limit = _seconds(info["time_used"]), _seconds(info["time_limit"])
        if left is None and used is not None and limit is not None:
            left = max(0, limit - used)     # squeue says INVALID once the limit has passed
        before = slurm.settings(cfg).signal_before
        if left is not None and left <= before + SIGNAL_RESOLUTION:
            return "time_limit", (f"Slurm's time limit (SIG{signal} {left:.0f}s before the "
                                  f"{info['time_limit']} limit, from --signal=B:TERM@{before:.0f})")
        return "signal", f"SIG{signal} to the job script (scancel --signal, or a kill on the node)"
    if signal:
        return "signal", f"SIG{signal} to the job script"
    if exit_code is not None:
        return "exited", f"the daemon exiting by itself (code {exit_code})"
    if info is None:
        return "unknown", ("an end nobody recorded: Slurm no longer knows the job (finished more than "
                           "MinJobAge ago, or slurmctld lost it): node failure or SIGKILL")
    return "exited", "the job script exiting"


def _seconds(slurm_time):
    """Slurm's [D-]HH:MM:SS / MM:SS as seconds; None for INVALID, UNLIMITED, NOT_SET."""
    text = (slurm_time or "").strip()
    days = 0
    if "-" in text:
        d, _, text = text.partition("-")
        if not d.isdigit():
            return None
        days = int(d)
    parts = text.split(":")
    if not parts or not all(p.isdigit() for p in parts) or len(parts) > 3:
        return None
    secs = 0
    for p in parts:
        secs = secs * 60 + int(p)
    return days * 86400 + secs


def _record_end(cfg, paths, job, info, by, signal=None, exit_code=None, reason=None):
    """Record once (under a lock) how the job ended: a job_end event in the results log and
    `ended` in slurm-job.json. Returns the `ended` dict (the earlier one if already recorded)."""
    lock_path = os.path.join(paths.state_dir, JOB_LOCK)
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = read_job(paths.state_dir) or job
        if current.get("job_id") == job["job_id"] and current.get("ended"):
            return current["ended"]
        key, words = reason or _reason(cfg, paths, job, info, signal, exit_code)
        ended = {"time": time.time(), "reason": key, "detail": words, "by": by,
                 "slurm_state": info["state"] if info else None,
                 "slurm_reason": info["reason"] if info else None, "signal": signal, "exit_code": exit_code}
        state_file = read_state(paths) or {}
        rec = records.event_record("job_end", pid=os.getpid(), detail=f"Slurm job {job['job_id']} ended by {words}",
                                   run_id=state_file.get("run_id"), scheduler="slurm", job_id=job["job_id"],
                                   reason=key, slurm_state=ended["slurm_state"], recorded_by=by)
        _append(cfg, paths, state_file.get("results_log") or paths.results_log, rec)
        _write_job(paths.state_dir, dict(current if current.get("job_id") == job["job_id"] else job, ended=ended))
        _remove(os.path.join(paths.state_dir, STOP_FILE))
        return ended


def _append(cfg, paths, path, rec):
    try:
        log = ResultsLog(path, cfg.stress.rotate_bytes, cfg.stress.rotate_keep, event_fields={"pid": os.getpid()})
        try:
            log.append(rec)
        finally:
            log.close()
    except OSError as e:
        print(f"collbench stress: cannot append the job_end record to {path}: {e}", file=sys.stderr)
