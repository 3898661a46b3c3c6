"""The config's schema: every top-level key and section, declared once (SCHEMA). A plain key maps
to (kind, default; None: not set), a section to its own schema; the loader walks this table."""

from collbench.config.kinds import (BOOL, DOCTOR_HOSTS, DSCP, FRACTION, HOST_SOURCES, Kind, LINK_WIDTH, NETDEV_NAMES,
                                    NONNEG_FLOAT, NONNEG_SECONDS, PATH, PORT, POS_FLOAT,
                                    POS_INT, POS_SECONDS, RANKS, ROTATE_KEEP, SECONDS, SIZE, STR, STR_LIST,
                                    STR_MAP, TOP_K, NONNEG_INT, PRIORITIES, PRIORITY, choice)
from collbench.ops import DATATYPES

LAUNCHERS = ("mpirun", "srun", "none")   # none: one process, no launcher (engines/launcher.py)
TRANSPORTS = ("shm", "ob1-tcp", "ucx", "ucx-tcp", "none")
# the config's `engine` choices; collbench/engines registers the module of each (engines/<name>.py,
# `-` as `_`): the config names them without importing an engine
ENGINES = ("builtin", "osu", "nccl-tests")

# Sections with plain keys: key -> (kind, default). None default means "not set".
STRESS_SCHEMA = {
    "pause": (NONNEG_SECONDS, 0.0),          # seconds between plan passes
    "duty_cycle": (FRACTION, 1.0),           # at most this share of wall time in MPI jobs
    "backoff_initial": (POS_SECONDS, 5.0),   # seconds before the first relaunch
    "backoff_max": (POS_SECONDS, 300.0),     # cap of the exponential back-off
    "rotate_bytes": (SIZE, 100 << 20),       # rotate the results log past this size
    "rotate_keep": (ROTATE_KEEP, 5),         # rotated files kept
    "results_log": (PATH, None),              # default <state_dir>/results.jsonl
    "stop_grace": (POS_SECONDS, 10.0),       # SIGTERM -> SIGKILL grace, seconds
}

# the collectors that read only this host's counters, no results log: what the per-host counters
# exporter (--counters-only) serves and its unit (ctl deploy --counters-exporter) may select; each
# collector's own registration says the same (counters=True), tests/test_exporter_collectors.py
COUNTERS_COLLECTORS = ("rdma_sysfs", "ethtool", "netstat")
EXPORTER_SCHEMA = {
    "listen": (STR, "0.0.0.0:9105"),
    "results_log": (PATH, None),              # default: the daemon's log in state_dir
    "max_age": (POS_SECONDS, 900.0),         # seconds before a result series disappears
    "poll_interval": (POS_SECONDS, 1.0),     # seconds between log polls
    "legacy_metrics": (BOOL, False),
    "tls_cert": (PATH, None),
    "tls_key": (PATH, None),
    "basic_auth_user": (STR, None),
    "basic_auth_password_file": (PATH, None),  # file holding the password; never in this config
    "sysfs_root": (PATH, "/sys"),
    "procfs_root": (PATH, "/proc"),
    "ethtool": (STR, "ethtool"),
    "netdevs": (STR_LIST, None),             # default: the RDMA devices' netdevs from sysfs
    "device_include": (STR, None),           # regex on RDMA device / netdev names
    "device_exclude": (STR, None),
    "collectors": (STR_LIST, ["results", "rdma_sysfs", "ethtool", "netstat", "congestion_top", "latency_shift"]),
    "collector_timeout": (POS_SECONDS, 3.0), # a collector not done within this is left out of the scrape
    "max_series": (POS_INT, 10000),          # result series kept per metric family; more are dropped and counted
    "congestion_top_k": (TOP_K, 3),          # collbench_step_congestion_top: hosts per op and size
    "baseline": (STR, None),                 # baseline NAME (in state_dir) or PATH.json: collbench_baseline_* series
    "inspector_dir": (PATH, None),           # the NCCL Inspector's dump dir on this host (docs/INSPECTOR.md)
    "inspector_window": (POS_SECONDS, 300.0),  # collbench_inspector_*: quantiles over this window
    "inspector_top_k": (POS_INT, 20),        # communicators exported (most bytes in the window); the rest counted
}
# the congestion counters read around every step (collbench/congestion, docs/CONGESTION.md)
CONGESTION_SCHEMA = {
    "enabled": (BOOL, True),                 # the built-in engine reads them around each step
    "sysfs_root": (PATH, "/sys"),            # RDMA counters under <sysfs_root>/class/infiniband
    "netstat": (PATH, "/proc/net/netstat"),  # IpExt/TcpExt ECN and retransmit counters
    "ethtool_root": (PATH, None),            # a directory of `ethtool -S` outputs, one file per netdev; unset: the ioctl
    "netdevs": (STR_LIST, None),             # default: the files in ethtool_root, else the RDMA devices' netdevs
    "xmit_wait_tick_ns": (POS_FLOAT, 8.0),   # port_xmit_wait's tick (NIC generation dependent: docs/METRICS.md)
    "paths": (BOOL, True),                   # TCP transports: tcp_info per peer too (congestion.paths)
    "rdma_qp_root": (PATH, None),            # a tree of per-QP counters and peers (docs/CONGESTION.md); unset: none
    "hosts": (HOST_SOURCES, {}),             # per-host sysfs_root / netstat / ethtool_root / netdevs
}
# `collbench doctor`: where each host's RoCE settings are read, and what they must be (unset: only
# compared between hosts); docs/DOCTOR.md
DOCTOR_SCHEMA = {
    "sysfs_root": (PATH, "/sys"),            # /sys/class/net and /sys/class/infiniband under it
    "qos_dir": (PATH, None),                 # files <netdev> holding `mlnx_qos -i <netdev>`; unset: run mlnx_qos
    "netdevs": (NETDEV_NAMES, None),         # default: the RDMA ports' netdevs, else every netdev but lo
    "hosts": (DOCTOR_HOSTS, {}),             # per-host sysfs_root / qos_dir read here (fixture trees)
    "remote": (BOOL, False),                 # read each host over SSH (master.hosts_ssh_config, remote_dir, python)
    "mtu": (POS_INT, None),
    "link_gbps": (POS_FLOAT, None),          # an RDMA port's rate, e.g. 100
    "link_width": (LINK_WIDTH, None),        # e.g. 4X
    "pfc_priorities": (PRIORITIES, None),    # PFC-enabled priorities, e.g. [3]
    "ecn_priorities": (PRIORITIES, None),    # ECN enabled (roce_np and roce_rp) on these
    "trust": (choice("pcp", "dscp"), None),
    "cnp_802p_prio": (PRIORITY, None),
    "cnp_dscp": (DSCP, None),
    "gid_index": (NONNEG_INT, None),         # the RoCE v2 GID index the jobs use
    "results_records": (POS_INT, 200),       # the latest records of the results log looked at
}
MASTER_SCHEMA = {
    "host": (STR, None),                     # address or ~/.ssh/config alias; unset = act locally
    "user": (STR, None),
    "port": (PORT, None),
    "identity_file": (PATH, None),
    "known_hosts": (PATH, None),              # default ~/.ssh/known_hosts
    "ssh_config": (PATH, None),               # default ~/.ssh/config
    "connect_timeout": (POS_SECONDS, 10.0),
    "command_timeout": (POS_SECONDS, 3600.0),
    "remote_dir": (STR, "/opt/collbench"),   # where collbench lives on the master
    "remote_config": (STR, None),            # config path on the master (default: uploaded copy)
    "remote_state_dir": (STR, None),
    "python": (STR, "python3"),
    "hosts_ssh_config": (STR, None),         # ssh config the master uses to reach the hosts (servers, deploy)
}
ALERTS_SCHEMA = {
    "for": (STR, "2m"),                      # how long a latency must stay above a bound
    "stale_after": (POS_SECONDS, 600.0),     # results older than this fire ResultsStale
    "failure_window": (STR, "15m"),
    "nodes": (POS_INT, 8),                   # the cluster size the thresholds are for
    "link_gbps": (POS_FLOAT, 25.0),          # the link speed the thresholds are for
    "job": (STR, "collbench"),               # Prometheus job name of the exporter's scrape
    "regression_ratio": (POS_FLOAT, 1.5),    # CollbenchLatencyRegression: live / baseline above this
    "regression_k": (NONNEG_FLOAT, 3.0),     # ... and above the baseline median + k x its sigma
    "regression_for": (STR, None),           # ... for this long (default: alerts.for)
    "shift_ratio": (POS_FLOAT, 1.2),         # CollbenchLatencyShift: the shifted steps' median / the reference at least
}
# launcher: srun, and the stress loop as a Slurm job (collbench/stress/slurm_job.py)
SLURM_SCHEMA = {
    "partition": (STR, None),                # srun/sbatch --partition
    "account": (STR, None),                  # --account
    "time_limit": (SECONDS, None),           # --time, rounded up to whole minutes (Slurm's unit)
    "nodes": (POS_INT, None),                # --nodes (default: Slurm's choice, or the allocation's)
    "mpi": (STR, "pmix"),                    # srun --mpi (Debian's OpenMPI 4.1 speaks PMIx only)
    "srun_args": (STR_LIST, []),             # extra srun arguments
    "sbatch_args": (STR_LIST, []),           # extra sbatch arguments of the stress job
    "job_name": (STR, "collbench-stress"),   # the stress job's name
    "signal_before": (SECONDS, 60.0),        # SIGTERM the stress job this long before its time limit
    "stress_job": (BOOL, False),             # `stress start` submits the loop as a job (--scheduler slurm)
}
PLAN_STEP_KEYS = ("op", "sizes", "iterations", "warmup", "datatype", "algorithm")
# Keys whose value is more than one kind: their loader method reads them (hosts, plan, ...).
HOSTS = Kind(None, "a hostfile path or a non-empty list of hosts (name, 'name:slots' or {host: name, slots: N})")
HOSTS_ORDER = Kind(None, "a list of the config's hosts, one per rank")
PLAN = Kind(None, "a non-empty list of {op, sizes, iterations, warmup, datatype, algorithm}")
THRESHOLDS = Kind(None, "a mapping with keys: latency, ecn_rate, default_latency")

# The config: every top-level key, declared once. A plain key maps to (kind, default; None:
# not set), a section to its schema. Defaults that depend on other keys are build_config's
# (noted here). Validation walks this table; the order is the one error messages list.
SCHEMA = {
    "hosts": (HOSTS, None),                  # unset: this machine only (implicit_hosts)
    "ranks": (RANKS, None),                  # default: len(hosts_order), the hosts' slots, or min(4, 2 x CPUs) here
    "ranks_per_node": (RANKS, None),         # unset: fill slots in order
    "oversubscribe": (BOOL, None),           # default: true on this machine only, false with hosts
    "launcher": (choice(*LAUNCHERS), "mpirun"),
    "launcher_path": (STR, None),
    "launcher_args": (STR_LIST, []),
    "env": (STR_MAP, {}),
    "transport": (choice(*TRANSPORTS), None),   # default: shm on this machine, ob1-tcp with hosts
    "engine": (choice(*ENGINES), "builtin"),
    "osu_path": (PATH, None),
    "nccl_tests_dir": (PATH, None),          # engine nccl-tests: its build directory (unset: $PATH)
    "engine_path": (PATH, None),
    "datatype": (choice(*DATATYPES), None),     # unset: per op (reductions float, the others char)
    "validate": (BOOL, False),
    "step_timeout": (SECONDS, 600.0),
    "plan": (PLAN, None),                    # unset: the default plans (PROTOTYPE_PLAN ...)
    "thresholds": (THRESHOLDS, None),        # unset: the prototype's defaults
    "state_dir": (PATH, None),               # default: default_state_dir()
    "stress": STRESS_SCHEMA,                 # and stress.plan (PLAN)
    "exporter": EXPORTER_SCHEMA,
    "master": MASTER_SCHEMA,
    "alerts": ALERTS_SCHEMA,
    "slurm": SLURM_SCHEMA,
    "hosts_order": (HOSTS_ORDER, None),      # one config host per rank
    "mpicc": (STR, None),                    # the MPI C compiler wrapper for the built-in engine
    "congestion": CONGESTION_SCHEMA,
    "doctor": DOCTOR_SCHEMA,
}
TOP_KEYS = tuple(SCHEMA)
