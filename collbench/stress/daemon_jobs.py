"""How the daemon's jobs are started and stopped (the engine interface's JobRunner)."""

from collbench.engines.mpi_job import JobRunner, MpiJob

# Lines of MPI's stderr kept in a failure record (OpenMPI's help blocks run to ~25 lines).
TAIL_LINES = 40
# A job's first record may wait for the launch (ssh, orted, MPI_Init) on top of one step.
LAUNCH_SLACK = 60.0


class DaemonJobs(JobRunner):
    """How the daemon's jobs are started and stopped: its token in their environment, their
    output to mpi-output.log, the running job known to the signal handlers and the guard."""

    stderr_tail_lines = TAIL_LINES
    launch_slack = LAUNCH_SLACK

    def __init__(self, daemon):
        super().__init__(stop_grace=daemon.cfg.stress.stop_grace)
        self.daemon = daemon

    def start(self, argv, env):
        job = MpiJob(argv, self.daemon._job_env(env), output_log=self.daemon.mpi_log)
        self.daemon._start_job(job)
        return job

    def stop(self, job):
        return self.daemon._stop_job() if job is self.daemon.job else job.stop(self.stop_grace)

    def finish(self, job):
        # always stopped: after a clean exit too, what is left of its session goes, zombies are reaped
        if job is self.daemon.job:
            self.daemon._stop_job()
        else:
            super().finish(job)
