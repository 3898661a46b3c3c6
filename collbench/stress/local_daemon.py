"""The stress loop as a local daemon: the backend behind `stress start|stop|status` when no
Slurm job runs it."""

from collbench.stress import daemonize, status, stop
from collbench.stress.backend import Backend


class LocalDaemon(Backend):
    name = "local"

    def start(self, args, cfg, paths):
        return daemonize.start(args, cfg, paths)

    def stop(self, args, cfg, paths):
        return stop.stop_daemon(args, cfg, paths)

    def status(self, args, cfg, paths):
        return status.report(args, cfg, paths)
