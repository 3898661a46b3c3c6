"""The stress loop: keep the fabric busy with collectives, one record per (iteration, op, size).

Three ways to run the plan, one per situation:

* ``loop`` — an engine that loops in one job (the built-in engine), no pause, full duty cycle:
  ONE long-lived MPI job runs the plan over and over (`collbench-engine --loop`) and streams a
  record per step. No relaunch cost, so the fabric is busy nearly all the time (see
  bench/duty_cycle.py).
* ``pass`` — the same engine with `stress.pause` or `stress.duty_cycle` < 1: one job per plan
  pass, then the nodes are released (no ranks spinning in MPI) for the pause.
* ``step`` — any other engine (`engine: osu`): one mpirun per (op, size), as the prototype
  this project replaces did in its bash loop.

The daemon runs jobs only through the engine interface (collbench.engines.base: run_loop);
how the jobs are started and stopped is its own (daemon_jobs.DaemonJobs: its token,
mpi-output.log (mpi_output.py), stop).

A job that fails (a rank killed, a host lost, a timeout, a validation error) becomes a failure
record with MPI's stderr tail; the daemon then waits a capped exponential back-off and
relaunches. The back-off resets once a job completes a whole plan pass. The daemon never
exits on a job fault, and never spins: every relaunch is preceded by a back-off.

Everything the daemon starts carries COLLBENCH_STRESS_TOKEN=<token> in its environment and
the daemon is a child subreaper, so on stop it can find and kill by pid every process it
started, even those whose parent died first (never by name). Ranks orphaned by a dying mpirun
are reaped as soon as their job is stopped (and by the guard, within a second, if later).

A guard thread (guard.py) checks once a second what an operator may do under the running
daemon: the results log or mpi-output.log renamed or deleted (reopened, `log_reopened` event)
and the state directory deleted (recreated, lock re-taken, pid and state files rewritten,
`state_dir_recreated` event).
"""

import collections
import ctypes
import logging
import os
import select
import signal
import threading
import time
import uuid

from collbench import proctree, signals
from collbench.engines import get_engine, launcher
from collbench.engines.base import failure_message, run_per_step
from collbench.results import records
from collbench.results.results_log import ResultsLog
from collbench.results.state_dir import (STOPPED, DaemonLock, read_pid_file, read_state, remove_pid_file,
                                         write_json_atomic, write_pid_file)
from collbench import bench_processes as processes
from collbench.stress.daemon_jobs import DaemonJobs
from collbench.stress.guard import Guard, same_file
from collbench.stress.mpi_output import RawOutputLog

log = logging.getLogger("collbench.stress")

MODES = ("loop", "pass", "step")
_PR_SET_CHILD_SUBREAPER = 36
# How often the state file is rewritten while records stream (status reads it).
_STATE_INTERVAL = 1.0
# Sessions of recent jobs whose orphaned processes the guard may reap.
_SESSIONS_KEPT = 16


def choose_mode(cfg, engine=None):
    engine = engine or get_engine(cfg.engine)
    if not engine.loops_in_one_job:
        return "step"
    if cfg.stress.pause > 0 or cfg.stress.duty_cycle < 1.0:
        return "pass"
    return "loop"


def backoff_delay(failures, initial, maximum):
    """Seconds before relaunch number `failures` (1, 2, ...): initial * 2^(n-1), capped."""
    return min(maximum, initial * (2 ** max(0, min(failures - 1, 62))))


class Daemon:
    """One daemon life: lock, pid/state files, the job loop, clean stop."""

    def __init__(self, cfg, paths, mode=None, plan=None):
        self.cfg = cfg
        self.paths = paths
        self.engine = get_engine(cfg.engine)
        self.mode = mode or choose_mode(cfg, self.engine)
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}, expected one of {MODES}")
        self.plan = list(plan or cfg.stress_plan())
        self.pid = os.getpid()
        self.token = f"{self.pid}-{uuid.uuid4().hex[:12]}"
        self.stopping = False
        self.stop_reason = None
        self.iteration = 0
        self._pass_open = False        # some steps of pass `iteration` done, not all
        self.failures = 0              # consecutive failed jobs (reset by a healthy pass)
        self.relaunches = 0
        self.records_written = 0
        self.job = None
        self.job_pid = None
        self.status = "starting"
        self.last_error = None
        self.started = time.time()
        self._state_written = 0.0
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._lock = DaemonLock(paths)
        self.results = None
        self.mpi_log = None
        self.jobs = DaemonJobs(self)
        self.ctx = None
        # One lock for everything two threads write (results log, state file, pid and lock files):
        # the guard thread repairs them while the main thread runs jobs.
        self._io_lock = threading.RLock()
        self.guard = Guard(self)
        self._pending_events = collections.deque()   # from mpi-output.log's writers (reader threads)
        self._live_launchers = set()                  # Popen pids: subprocess waits for those
        self._job_sessions = collections.deque(maxlen=_SESSIONS_KEPT)
        self._stdio_is_daemon_log = False

    # ------------------------------------------------------------------ life

    def run(self, on_ready=None):
        """Run until SIGTERM/SIGINT (or stop()). Returns the exit code (0 after a clean stop).

        Raises AlreadyRunning before touching anything if another daemon holds the state dir.
        on_ready(pid) is called once the pid and state files are written.
        """
        self.paths.ensure()
        self._lock.acquire()
        try:
            self._install_signals()
            self._take_over_stale()
            write_pid_file(self.paths, self.pid)
            _become_subreaper()
            self._stdio_is_daemon_log = same_file(2, self.paths.daemon_log)
            self.results = ResultsLog(self.paths.results_log, self.cfg.stress.rotate_bytes,
                                      self.cfg.stress.rotate_keep)
            self.mpi_log = RawOutputLog(self.paths.mpi_output, self.cfg.stress.rotate_bytes,
                                        on_event=self._queue_event)
            self.engine.preflight(self.cfg, self.plan)
            self.ctx = records.RunContext(self.cfg, self.engine.name,
                                          launcher.mpi_version(self.cfg))
            self.results.event_fields = {"pid": self.pid, "run_id": self.ctx.run_id}
            self._write_state("running", force=True)
            self._event("start", f"mode {self.mode}, {len(self.plan)} steps, {self.cfg.ranks} ranks on "
                                 f"{','.join(self.ctx.hosts) or 'the nodes Slurm picks'}, engine {self.engine.name}",
                        mode=self.mode, steps=len(self.plan), config=self.cfg.source)
            log.info("started pid %d, mode %s, results %s", self.pid, self.mode, self.paths.results_log)
            self.guard.start()
            if on_ready:
                on_ready(self.pid)
            self._loop()
        finally:
            self._shutdown()
        return 0

    def request_stop(self, reason="stop requested"):
        """Safe from a signal handler: flag, wake any sleep, ask the running job to stop."""
        if not self.stopping:
            self.stopping = True
            self.stop_reason = reason
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self.job_pid:   # the job leads its own process group (MpiJob)
            proctree.signal_tree(self.job_pid, signal.SIGTERM)

    def _install_signals(self):
        def on_term(signum, _frame):
            self.request_stop(f"signal {signal.Signals(signum).name}")
            # if the job ignores SIGTERM, a SIGKILL follows after the grace period
            signal.alarm(max(1, int(self.cfg.stress.stop_grace + 0.999)))

        def on_alarm(_signum, _frame):
            if self.stopping and self.job_pid:
                log.warning("job did not stop within %.0fs of SIGTERM: SIGKILL", self.cfg.stress.stop_grace)
                proctree.signal_tree(self.job_pid, signal.SIGKILL, self._token_pids())

        signals.install(signals.DAEMON, on_term, extra={signal.SIGALRM: on_alarm})

    def _take_over_stale(self):
        """We hold the lock, so any pid file here is stale: say so, and kill its leftovers."""
        old_pid = read_pid_file(self.paths)
        old = read_state(self.paths) or {}
        if old_pid is not None:
            log.warning("replacing stale pid file (pid %s, previous daemon not running)", old_pid)
        token = old.get("token")
        if token:
            left = processes.token_pids(token)
            proctree.signal_tree(None, signal.SIGKILL, left)
            if left:
                log.warning("killed %d process(es) left by the previous daemon: %s", len(left), left)

    def _shutdown(self):
        try:
            self.guard.stop()
            if self.job is not None:
                self._stop_job()
            killed = self._kill_leftovers()
            if killed:
                log.warning("killed %d leftover process(es): %s", len(killed), killed)
            if self.results is not None and self.ctx is not None:
                self._event("stop", self.stop_reason or "stopped", iterations=self.iteration,
                            records=self.records_written)
                self.results.close()
            if self.mpi_log is not None:
                self.mpi_log.close()
            if self.ctx is not None:
                self._write_state(STOPPED, force=True)
        finally:
            signal.alarm(0)
            remove_pid_file(self.paths, self.pid)
            self._lock.release()
            log.info("stopped (%s)", self.stop_reason or "stopped")

    # ------------------------------------------------------------------ loop

    def _loop(self):
        while not self.stopping:
            try:
                ok = self._run_job()
            except Exception as e:   # a fault of ours or of the environment: record, back off
                log.exception("job loop")
                self._stop_job()
                self._failure(f"internal error: {type(e).__name__}: {e}")
                ok = False
            if self.stopping:
                break
            if ok:
                self.failures = 0
                self._after_pass_pause()
                continue
            self.failures += 1
            delay = backoff_delay(self.failures, self.cfg.stress.backoff_initial, self.cfg.stress.backoff_max)
            self._event("backoff", f"relaunch in {delay:.1f}s after {self.failures} consecutive failure(s)",
                        delay_s=round(delay, 3), failures=self.failures)
            self._write_state("backoff", force=True)
            if self._sleep(delay):
                break
            self.relaunches += 1
            self._event("relaunch", f"relaunch {self.relaunches} after {self.failures} failure(s)",
                        attempt=self.relaunches)

    def _after_pass_pause(self):
        s = self.cfg.stress
        if self.mode == "loop":
            return
        wait = s.pause
        if s.duty_cycle < 1.0 and self._last_job_seconds:
            wait = max(wait, self._last_job_seconds * (1.0 / s.duty_cycle - 1.0))
        if wait > 0:
            self._write_state("paused", force=True)
            self._sleep(wait)

    def _sleep(self, seconds):
        """Sleep, woken early by a stop. Returns True if a stop was requested."""
        end = time.monotonic() + seconds
        while not self.stopping:
            left = end - time.monotonic()
            if left <= 0:
                break
            try:
                select.select([self._wake_r], [], [], left)
            except InterruptedError:
                pass
        try:
            while os.read(self._wake_r, 64):
                pass
        except BlockingIOError:
            pass
        return self.stopping

    # ------------------------------------------------------------------ jobs

    _last_job_seconds = 0.0

    def _run_job(self):
        """Run one job (the whole daemon life in loop mode). True if it ended healthy."""
        with self._io_lock:
            self.guard.check_state_dir()   # the job's plan file goes there: repair it before launching
        t0 = time.monotonic()
        try:
            return self._run_records(self._engine_records())
        finally:
            self._last_job_seconds = time.monotonic() - t0

    def _engine_records(self):
        """The engine's LoopRecords for one job: forever in one job (loop), one pass (pass), or
        one pass of one job per step (step)."""
        first = self.iteration + 1
        if self.mode == "step":
            return run_per_step(self.engine, self.cfg, self.plan, self.ctx, self.jobs, first, passes=1,
                                plan_path=self.paths.plan)
        return self.engine.run_loop(self.cfg, self.plan, self.ctx, self.jobs, first_iteration=first,
                                    passes=None if self.mode == "loop" else 1, plan_path=self.paths.plan)

    def _run_records(self, stream):
        """Append the records as they come; False at the first failure (unless we are stopping)."""
        try:
            for item in stream:
                if item.record["type"] == "failure":
                    if self.stopping:   # the job we stopped, not a fault
                        return True
                    self._append_failure(item)
                    return False
                self._append_result(item)
                if self.stopping:
                    return True
        finally:
            stream.close()   # stops a job still running
        return True

    def _job_env(self, env):
        env = dict(env)
        env[processes.TOKEN_ENV] = self.token
        return env

    def _start_job(self, job):
        with self._io_lock:   # the guard must know the launcher before it can see it exit
            job.start()
            self._live_launchers.add(job.pid)
            self._job_sessions.append(job.pid)
        self.job = job
        self.job_pid = job.pid
        self._write_state("running", force=True)
        if self.stopping:   # a stop that came while we were launching
            proctree.signal_tree(job.pid, signal.SIGTERM)

    def _stop_job(self):
        """Make sure the current job is gone (SIGTERM, SIGKILL after stop_grace); pids that needed SIGKILL."""
        job = self.job
        if job is None:
            return []
        killed = []
        try:
            killed = job.stop(self.cfg.stress.stop_grace)
            if killed:
                log.warning("SIGKILLed job processes that outlived SIGTERM: %s", killed)
        except Exception:
            log.exception("stopping the MPI job")
        if job.returncode is not None:   # waited: its pid is no longer ours to protect
            with self._io_lock:
                self._live_launchers.discard(job.pid)
        self.job = None
        self.job_pid = None
        return killed

    # ------------------------------------------------------------------ records

    def _append_result(self, item):
        """A result of plan pass item.iteration: the daemon's fields, then the log."""
        self.iteration = max(self.iteration, item.iteration)
        self._pass_open = item.step != len(self.plan) - 1
        if not self._pass_open:
            self.failures = 0   # a whole pass: the job is healthy, back-off resets
        rec = item.record
        rec["iteration"] = item.iteration
        if item.window is not None:   # the engine's wall-clock window of the step (duty cycle, tracing)
            rec["t_start"], rec["t_end"] = item.window
        self._append(rec)
        self._write_state("running")

    def _append_failure(self, item):
        rec = item.record
        rec["iteration"] = item.iteration
        self.last_error = rec["error"]
        log.warning("job failed: %s", rec["error"])
        self._append(rec)

    def _failure(self, error):
        """A failure of our own (not of a job): no step, the plan pass in progress."""
        rec = records.failure_record(self.ctx, failure_message(None, error, iteration=self._failure_iteration()))
        rec["iteration"] = self._failure_iteration()
        self.last_error = rec["error"]
        log.warning("job failed: %s", error)
        self._append(rec)

    def _failure_iteration(self):
        """The plan pass a failure belongs to: the one in progress (next, if none is open)."""
        return self.iteration if self._pass_open else self.iteration + 1

    def _event(self, event, detail, **extra):
        self._append(records.event_record(event, pid=self.pid, detail=detail, run_id=self.ctx.run_id
                                          if self.ctx else None, **extra))

    def _queue_event(self, event, detail, **extra):
        """From any thread (mpi-output.log's writers): written with the next record or guard tick."""
        self._pending_events.append((event, detail, extra))

    def _append(self, rec):
        with self._io_lock:
            self._append_pending()
            self._append_one(rec)

    def _append_pending(self):
        while self._pending_events:
            event, detail, extra = self._pending_events.popleft()
            self._append_one(records.event_record(event, pid=self.pid, detail=detail,
                                                  run_id=self.ctx.run_id if self.ctx else None, **extra))

    def _append_one(self, rec):
        try:
            self.results.append(rec)
        except OSError as e:   # a full disk must not kill the loop; the gap shows as stale results
            log.error("cannot append to %s: %s", self.paths.results_log, e)
        self.records_written = self.results.written

    def _write_state(self, status, force=False):
        with self._io_lock:
            self._write_state_locked(status, force)

    def _write_state_locked(self, status, force):
        self.status = status
        now = time.time()
        if not force and now - self._state_written < _STATE_INTERVAL:
            return
        self._state_written = now
        state = {
            "pid": self.pid, "proc_start": proctree.start_ticks(self.pid), "token": self.token,
            "started": self.started, "updated": now, "status": status, "mode": self.mode,
            "engine": self.engine.name, "iteration": self.iteration, "config": self.cfg.source,
            "results_log": os.path.abspath(self.paths.results_log),
            "mpi_output": os.path.abspath(self.paths.mpi_output),
            "job_pid": self.job_pid, "relaunches": self.relaunches, "failures": self.failures,
            "last_error": self.last_error, "records": self.records_written,
            "seq": self.results.last_seq if self.results else None,
            "run_id": self.ctx.run_id if self.ctx else None,
            "plan": [[s.op, s.size_bytes] for s in self.plan],
        }
        try:
            write_json_atomic(self.paths.state, state)
        except OSError as e:
            log.error("cannot write %s: %s", self.paths.state, e)

    # ------------------------------------------------------------------ cleanup

    def _token_pids(self):
        return [p for p in processes.token_pids(self.token) if p != self.pid]

    def _kill_leftovers(self):
        """SIGKILL anything still carrying our token, then reap our (adopted) children."""
        killed = []
        for _ in range(3):
            left = [p for p in self._token_pids() if proctree.pid_alive(p)]
            if not left:
                break
            proctree.signal_tree(None, signal.SIGKILL, left)
            killed += left
            time.sleep(0.2)
        proctree.reap_children()
        return sorted(set(killed))


def _become_subreaper():
    """Orphaned descendants (ranks whose mpirun died) re-parent to us, not to init."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
