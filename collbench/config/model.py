"""What a loaded config is: hosts, plan steps, the Config itself, and the defaults that depend on
nothing but this machine (state directory, rank count, the default plans, OSU's iteration counts)."""

import os
from dataclasses import dataclass, field
from types import SimpleNamespace


from collbench.ops import default_datatype, get_op
from collbench.sizes import format_size, parse_size
from collbench.thresholds import Thresholds

# the stress plan of the prototype this project replaces (its bash loop): (op, sizes, iterations)
PROTOTYPE_PLAN = (
    ("allreduce", ("4MB", "1MB", "64KB", "1KB"), 500),
    ("bcast", ("4MB", "1MB"), 500),
    ("alltoall", ("1MB",), 300),
    ("allgather", ("128KB",), 500),
    ("reduce", ("1MB",), 500),
)
# `once` with no plan runs every op: the prototype's plan plus the two ops it leaves out.
ONCE_EXTRA_PLAN = (
    ("reduce_scatter", ("1MB",), 500),
    ("barrier", ("0",), 1000),
)


@dataclass(frozen=True)
class Host:
    name: str
    slots: int = 1


@dataclass(frozen=True)
class Step:
    op: str
    size_bytes: int      # 0 for barrier
    iterations: int
    warmup: int
    datatype: str
    # engine plan options beyond OSU's (defaults: what OSU does)
    inplace: bool = False
    root: int = 0
    timing: str = "osu"          # "osu" | "sustained"
    samples: bool = False        # per-iteration times: p50/p90/p99 in the record
    algorithm: str = None        # the MPI's collective algorithm to force (None: its own choice)
    # the config's plan step set `iterations` (else OSU's count for the size): --sizes keeps it
    iterations_set: bool = field(default=False, compare=False)

    @property
    def size_label(self):
        return format_size(self.size_bytes) if self.size_bytes else "-"


@dataclass
class Config:
    source: str                      # file path, or "<default>"
    hosts: list                      # [Host]
    hostfile: str                    # path when hosts came from a hostfile, else None
    ranks: int
    ranks_per_node: int              # None: fill slots in order
    oversubscribe: bool
    launcher: str
    launcher_path: str
    launcher_args: list
    env: dict
    transport: str
    engine: str
    osu_path: str
    engine_path: str
    datatype: str                    # None: per op default
    validate: bool
    step_timeout: float
    plan: list                       # [Step]; None when the config gives none
    thresholds: Thresholds
    state_dir: str
    stress: SimpleNamespace
    exporter: SimpleNamespace
    master: SimpleNamespace
    alerts: SimpleNamespace
    implicit_hosts: bool = False     # no hosts in the config: ranks on this machine only
    slurm: SimpleNamespace = None    # SLURM_SCHEMA's keys
    hosts_order: list = None         # host of each rank (rank r on hosts_order[r]); None: the launcher's fill
    mpicc: str = None                # the MPI's C compiler wrapper for the engine (default: beside launcher_path, or mpicc)
    nccl_tests_dir: str = None       # engine nccl-tests: where <op>_perf are (None: $PATH)
    congestion: SimpleNamespace = None   # CONGESTION_SCHEMA's keys
    doctor: SimpleNamespace = None       # DOCTOR_SCHEMA's keys
    base_dir: str = None             # what relative paths in the config are relative to (its directory)

    @property
    def host_names(self):
        return [h.name for h in self.hosts]

    def resolve_path(self, path):
        """A path as this config writes it: ~ expanded, relative to the config file's directory
        (the current one for the embedded default). The loader resolves every PATH key with it."""
        return resolve_path(path, self.base_dir or os.getcwd())

    def placement(self):
        """Host names the ranks land on, in order (mpirun's by-slot fill, or ranks_per_node)."""
        per_host = [self.ranks_per_node or h.slots for h in self.hosts]
        used, left = [], self.ranks
        for h, n in zip(self.hosts, per_host):
            if left <= 0:
                break
            used.append(h.name)
            left -= n
        if left > 0 and self.oversubscribe and self.hosts:
            used = self.host_names  # mpirun wraps around: every host gets ranks
        return used

    @property
    def nodes(self):
        return max(1, len(self.placement()))

    def once_plan(self):
        return self.plan if self.plan is not None else default_plan(PROTOTYPE_PLAN + ONCE_EXTRA_PLAN, self.datatype)

    def stress_plan(self):
        if self.stress.plan is not None:
            return self.stress.plan
        return self.plan if self.plan is not None else default_plan(PROTOTYPE_PLAN, self.datatype)


def resolve_path(path, base_dir):
    """path with ~ expanded, made absolute against base_dir if relative."""
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(base_dir, path))


def flag_path(path):
    """A path given on the command line: ~ expanded, relative to the current directory."""
    return os.path.abspath(os.path.expanduser(path))


def default_state_dir():
    if os.geteuid() == 0:
        return "/var/lib/collbench"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "collbench")


def local_default_ranks():
    return min(4, (os.cpu_count() or 1) * 2)


def osu_default_iterations(size_bytes):
    """OSU 7.4's defaults (COLL_LOOP/SKIP_SMALL, _LARGE): 1000 iterations (100 warm-up) up to 8KB, 100 (10) above."""
    return (1000, 100) if size_bytes <= 8192 else (100, 10)


def default_plan(spec, datatype=None):
    steps = []
    for op_name, sizes, iterations in spec:
        op = get_op(op_name)
        for s in sizes:
            size = 0 if not op.has_size else parse_size(s)
            warmup = max(1, iterations // 10)
            steps.append(Step(op.name, size, iterations, warmup, datatype or default_datatype(op)))
    return steps
