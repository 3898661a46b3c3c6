"""`collbench stress start|stop|status|log|servers|run|job-end`: the stress daemon's verbs.

start   check everything in the foreground (config, launcher, engine), then daemonize
        (double fork, setsid, stdio to daemon.log) and wait until the daemon is up
run     the same daemon in the foreground (systemd, containers, debugging)
stop    SIGTERM the daemon (it stops its job); SIGKILL after stress.stop_grace; confirm by pid
status  running (0) / crashed (1) / stopped (3), like LSB init scripts; --json for machines
log     recent records, readable; -f follows across rotations
servers benchmark processes and their CPU on the configured hosts that are this machine

start, stop and status go to a backend (backend.py): the Slurm job when the state directory
is its business (slurm_job.SlurmJob.select), else the local daemon (local_daemon.py). The
verbs' work is in daemonize.py, stop.py, status.py, log_view.py, servers.py, slurm_job.py.
"""

from collbench.cli import add_config_arg
from collbench.stress import daemonize, log_view, servers, slurm_job
from collbench.stress.local_daemon import LocalDaemon
from collbench.stress.resolve import resolve
from collbench.stress.slurm_job import SlurmJob


def register(subparsers):
    p = subparsers.add_parser("stress", help="the stress daemon: keep the fabric busy with collectives",
                              description="The stress daemon: runs the stress plan around the clock and "
                                          "appends one record per (iteration, op, size) to the results log.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    def verb(name, func, help_):
        v = verbs.add_parser(name, help=help_, description=help_)
        add_config_arg(v)
        v.add_argument("--state-dir", metavar="DIR",
                       help="pid, state and log files (default: state_dir in the config, else "
                            "/var/lib/collbench as root, ~/.local/state/collbench otherwise)")
        v.set_defaults(func=func)
        return v

    start = v = verb("start", cmd_start, "start the daemon in the background")
    v.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                   help="how long to wait for the daemon to come up (default 60)")
    verb("run", cmd_run, "run the daemon in the foreground (what the systemd unit runs)")
    stop = verb("stop", cmd_stop, "stop the daemon, its MPI job and every process it started")
    status = v = verb("status", cmd_status, "running / stopped / crashed, iteration, last result per (op, size)")
    v.add_argument("--json", action="store_true", help="machine-readable status")
    v = verb("log", cmd_log, "show recent results, failures and events")
    v.add_argument("-n", "--lines", type=int, default=20, metavar="N", help="records to show (default 20)")
    v.add_argument("-f", "--follow", action="store_true", help="keep printing new records")
    v.add_argument("--json", action="store_true", help="print the raw JSON lines")
    v = verb("servers", cmd_servers, "benchmark processes and CPU on the configured hosts")
    v.add_argument("--interval", type=float, default=0.5, metavar="SECONDS", help="CPU sampling interval")
    v.add_argument("--json", action="store_true", help="machine-readable output")
    slurm_job.add_arguments(start, stop, status)   # --scheduler slurm: the loop as a Slurm job
    slurm_job.register(verbs, verb)


def _backend(verb, args):
    """(backend, cfg, paths) for start/stop/status: the Slurm job's if it claims the state dir."""
    cfg, paths = resolve(args)
    return SlurmJob.select(verb, args, cfg, paths) or LocalDaemon(), cfg, paths


def cmd_start(args):
    backend, cfg, paths = _backend("start", args)
    return backend.start(args, cfg, paths)


def cmd_stop(args):
    backend, cfg, paths = _backend("stop", args)
    return backend.stop(args, cfg, paths)


def cmd_status(args):
    backend, cfg, paths = _backend("status", args)
    return backend.status(args, cfg, paths)


def cmd_run(args):
    return daemonize.run(*resolve(args))


def cmd_log(args):
    return log_view.show_log(args, *resolve(args))


def cmd_servers(args):
    return servers.show_servers(args, *resolve(args))
