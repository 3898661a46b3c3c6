"""Slurm from collbench's side: the allocation we may be in, host lists, srun options, squeue.

`launcher: srun` runs the engine as a job step: inside an allocation (salloc, sbatch) on the
allocation's nodes, outside one as its own job (srun allocates). The `slurm` config section
adds partition, account, time limit, node count, the PMI plugin and extra srun arguments.
Slurm commands get the config's `env` (e.g. SLURM_CONF of a test cluster) like srun does.
"""

import math
import os
import re
import subprocess
from types import SimpleNamespace

from collbench.errors import UserError

DEFAULTS = {"partition": None, "account": None, "time_limit": None, "nodes": None, "mpi": "pmix",
            "srun_args": [], "sbatch_args": [], "job_name": "collbench-stress", "signal_before": 60.0,
            "stress_job": False}
COMMAND_TIMEOUT = 30.0   # seconds for one squeue/scancel/sbatch call: slurmctld answers or is down


def settings(cfg):
    """The config's slurm section (defaults when the config has none)."""
    s = getattr(cfg, "slurm", None)
    return s if s is not None else SimpleNamespace(**DEFAULTS)


def in_allocation(environ=None):
    """The job id of the allocation this process runs in (salloc, sbatch, srun), or None."""
    env = os.environ if environ is None else environ
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    return job if job and job.isdigit() else None


def time_option(seconds):
    """Slurm's --time value: whole minutes (Slurm's unit), rounded up, at least 1."""
    return str(max(1, math.ceil(seconds / 60.0)))


# ---------------------------------------------------------------- host lists

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text, limit=65536):
    """'n[1-3,5],gpu07' -> ['n1', 'n2', 'n3', 'n5', 'gpu07'] (zero padding kept, brackets nest
    by product: 'r[1-2]n[1-2]'). ValueError on a malformed list or one over `limit` hosts."""
    out = []
    for item in _split_top(text.strip()):
        if item:
            out.extend(_expand_one(item, limit - len(out)))
    return out


def _split_top(text):
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    parts.append("".join(cur))
    return parts


def _expand_one(item, limit):
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    prefix, body, rest = item[:start], item[start + 1:end], item[end + 1:]
    values = []
    for rng in body.split(","):
        m = _RANGE.match(rng.strip())
        if not m:
            raise ValueError(f"bad range {rng!r} in host list {item!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo) or int(hi) - int(lo) >= limit:
            raise ValueError(f"bad range {rng!r} in host list {item!r}")
        width = len(lo) if lo.startswith("0") else 0
        values += [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    tails = _expand_one(rest, limit) if rest else [""]
    if len(values) * len(tails) > limit:
        raise ValueError(f"host list {item!r} names more than {limit} hosts")
    return [prefix + v + t for v in values for t in tails]


def allocation_hosts(environ=None):
    """The nodes of the allocation we are in, in Slurm's order ([] outside one or if unreadable)."""
    env = os.environ if environ is None else environ
    if not in_allocation(env):
        return []
    try:
        return expand_hostlist(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    except ValueError:
        return []


# ---------------------------------------------------------------- srun

def srun_options(cfg, ranks):
    """srun arguments from the slurm section (after -n): the PMI plugin, and outside an
    allocation the nodes, partition, account and time limit of the job srun requests."""
    s = settings(cfg)
    args = [f"--mpi={s.mpi}", "--kill-on-bad-exit=1"]
    if not in_allocation():   # inside one, its shape (salloc/sbatch -N -n) is what the step gets
        if s.nodes:
            args += ["--nodes", str(min(s.nodes, ranks))]
        if s.partition:
            args += ["--partition", s.partition]
        if s.account:
            args += ["--account", s.account]
        if s.time_limit:
            args += ["--time", time_option(s.time_limit)]
    return args + list(s.srun_args)


def planned_hosts(cfg, ranks=None):
    """The hosts a run will use as far as known before it starts. With srun and no hosts in the
    config, Slurm decides: the allocation's first nodes when we are in one, else [] until the
    ranks report where they run (the engine's CBHOSTS line)."""
    if cfg.launcher != "srun" or not cfg.implicit_hosts:
        return cfg.placement()
    hosts = allocation_hosts()
    return hosts[:ranks or cfg.ranks]


# ---------------------------------------------------------------- commands

def command_env(cfg=None):
    """Environment of Slurm commands: ours plus the config's env (SLURM_CONF of a test cluster)."""
    env = dict(os.environ)
    if cfg is not None:
        env.update(cfg.env)
    return env


def run(argv, cfg=None, timeout=COMMAND_TIMEOUT):
    """Run a Slurm command; CompletedProcess (text). A missing command is a UserError."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=command_env(cfg), timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise UserError(f"{argv[0]} not found: install the Slurm client commands (slurm-client) "
                        "or run this on a login node of the cluster") from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} timed out after {timeout:g}s")


# squeue --format fields we read, separated by '|' (never in a job name we set, nor a state)
_SQUEUE_FIELDS = ("job_id", "state", "reason", "nodes", "time_used", "time_left", "time_limit", "name")
_SQUEUE_FORMAT = "%i|%T|%r|%N|%M|%L|%l|%j"


def job_info(job_id, cfg=None):
    """squeue's view of one job, finished ones included while slurmctld remembers them
    (MinJobAge): dict of _SQUEUE_FIELDS; None when Slurm no longer knows the job; raises
    UserError when squeue itself fails (slurmctld down)."""
    res = run(["squeue", "-h", "--states=all", "-j", str(job_id), "-o", _SQUEUE_FORMAT], cfg)
    if res.returncode != 0:
        err = (res.stderr or "").strip()
        if "Invalid job id" in err:
            return None
        raise UserError(f"squeue failed: {err or 'exit code ' + str(res.returncode)}")
    for line in res.stdout.splitlines():
        parts = line.split("|", len(_SQUEUE_FIELDS) - 1)
        if len(parts) == len(_SQUEUE_FIELDS) and parts[0] == str(job_id):
            return dict(zip(_SQUEUE_FIELDS, parts))
    return None
