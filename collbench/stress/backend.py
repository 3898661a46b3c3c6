"""How the stress loop runs: the backend interface.

Two backends: a local daemon (local_daemon.LocalDaemon: daemonized here, found by its pid and
lock files) and a Slurm job (slurm_job.SlurmJob: sbatch, squeue, scancel). `stress start|stop|
status` (cli.py) ask the Slurm backend whether the state directory is its business
(SlurmJob.select), else use the local daemon; a backend never imports the cli.
"""


class Backend:
    """start, stop, status of the stress loop; each returns the verb's exit code."""

    name = None

    def start(self, args, cfg, paths):
        raise NotImplementedError

    def stop(self, args, cfg, paths):
        raise NotImplementedError

    def status(self, args, cfg, paths):
        raise NotImplementedError
