"""The stress loop: keep the fabric busy with collectives, one record per (iteration, op, size).

Three ways to run the plan, one per situation:

* ``loop`` — built-in engine, no pause, full duty cycle: ONE long-lived MPI job runs the plan
  over and over (`collbench-engine --loop`) and streams a record per step. No relaunch cost,
  so the fabric is busy nearly all the time (see bench/duty_cycle.py).
* ``pass`` — built-in engine with `stress.pause` or `stress.duty_cycle` < 1: one job per plan
  pass, then the nodes are released (no ranks spinning in MPI) for the pause.
* ``step`` — `engine: osu`: one mpirun per (op, size), as the seed's bash loop did.

A job that fails (a rank killed, a host lost, a timeout, a validation error) becomes a failure
record with MPI's stderr tail; the daemon then waits a capped exponential back-off and
relaunches. The back-off resets once a job completes a whole plan pass. The daemon never
exits on a job fault, and never spins: every relaunch is preceded by a back-off.

Everything the daemon starts carries COLLBENCH_STRESS_TOKEN=<token> in its environment and
the daemon is a child subreaper, so on stop it can find and kill by pid every process it
started, even those whose parent died first (never by name).
"""

import ctypes
import logging
import os
import select
import signal
import time
import uuid

from collbench import launcher, proctree, records
from collbench.sizes import format_size
from collbench.step_runner import JobResult, JobTimeout, MpiJob, stderr_reason
from collbench.stress import processes
from collbench.stress.results_log import ResultsLog
from collbench.stress.state import (STOPPED, DaemonLock, read_pid_file, read_state, remove_pid_file,
                                    write_json_atomic, write_pid_file)

log = logging.getLogger("collbench.stress")

MODES = ("loop", "pass", "step")
_PR_SET_CHILD_SUBREAPER = 36
# How often the state file is rewritten while records stream (status reads it).
_STATE_INTERVAL = 1.0
# A job's first record may wait for the launch (ssh, orted, MPI_Init) on top of one step.
_LAUNCH_SLACK = 60.0
# Lines of MPI's stderr kept in a failure record (OpenMPI's help blocks run to ~25 lines).
_TAIL_LINES = 40


def choose_mode(cfg):
    if cfg.engine == "osu":
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
        self.mode = mode or choose_mode(cfg)
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}, expected one of {MODES}")
        self.plan = list(plan or cfg.stress_plan())
        self.engine = "osu" if self.mode == "step" and cfg.engine == "osu" else cfg.engine
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
        self._osu_dir = None
        self.ctx = None

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
            self.results = ResultsLog(self.paths.results_log, self.cfg.stress.rotate_bytes,
                                      self.cfg.stress.rotate_keep)
            self.mpi_log = RawOutputLog(self.paths.mpi_output, self.cfg.stress.rotate_bytes)
            if self.engine == "osu":
                from collbench import osu_engine
                self._osu_dir = osu_engine.preflight(self.cfg, self.plan)
            self.ctx = records.RunContext(self.cfg, self.engine,
                                          launcher.mpi_version(launcher.resolve_launcher(self.cfg)))
            self._write_state("running", force=True)
            self._event("start", f"mode {self.mode}, {len(self.plan)} steps, {self.cfg.ranks} ranks on "
                                 f"{','.join(self.cfg.placement())}, engine {self.engine}",
                        mode=self.mode, steps=len(self.plan), config=self.cfg.source)
            log.info("started pid %d, mode %s, results %s", self.pid, self.mode, self.paths.results_log)
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
        if self.job_pid:
            _signal_group(self.job_pid, signal.SIGTERM)

    def _install_signals(self):
        def on_term(signum, _frame):
            self.request_stop(f"signal {signal.Signals(signum).name}")
            # if the job ignores SIGTERM, a SIGKILL follows after the grace period
            signal.alarm(max(1, int(self.cfg.stress.stop_grace + 0.999)))

        def on_alarm(_signum, _frame):
            if self.stopping and self.job_pid:
                log.warning("job did not stop within %.0fs of SIGTERM: SIGKILL", self.cfg.stress.stop_grace)
                _signal_group(self.job_pid, signal.SIGKILL)
                for pid in self._token_pids():
                    _kill(pid, signal.SIGKILL)

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)   # a closing SSH session is not a stop
        signal.signal(signal.SIGALRM, on_alarm)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)

    def _take_over_stale(self):
        """We hold the lock, so any pid file here is stale: say so, and kill its leftovers."""
        old_pid = read_pid_file(self.paths)
        old = read_state(self.paths) or {}
        if old_pid is not None:
            log.warning("replacing stale pid file (pid %s, previous daemon not running)", old_pid)
        token = old.get("token")
        if token:
            left = processes.token_pids(token)
            for p in left:
                _kill(p, signal.SIGKILL)
            if left:
                log.warning("killed %d process(es) left by the previous daemon: %s", len(left), left)

    def _shutdown(self):
        try:
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
                self._failure(f"internal error: {type(e).__name__}: {e}", "", None, None)
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
        t0 = time.monotonic()
        try:
            if self.mode == "step":
                return self._run_steps_job()
            return self._run_engine_job(loop=self.mode == "loop")
        finally:
            self._last_job_seconds = time.monotonic() - t0

    def _job_env(self, env):
        env = dict(env)
        env[processes.TOKEN_ENV] = self.token
        return env

    def _run_engine_job(self, loop):
        """The built-in engine over the whole plan: looping forever (loop) or one pass."""
        from collbench import builtin_engine

        plan_path = os.path.join(self.paths.state_dir, "stress-plan.txt")
        argv, env = builtin_engine.engine_command(self.cfg, self.plan, plan_path, loop=loop,
                                                  validate=self.cfg.validate)
        job = MpiJob(argv, self._job_env(env), output_log=self.mpi_log)
        base = self.iteration
        nsteps = len(self.plan)
        last_step = -1          # index of the last finished step of this job
        passes_done = 0
        self._start_job(job)
        error, timed_out = None, False
        idle = self.cfg.step_timeout + _LAUNCH_SLACK
        try:
            for line in job.lines(idle_timeout=idle):
                rec = builtin_engine.parse_line(line)
                if rec is None:
                    continue
                iteration = base + rec["loop"] + 1
                self.iteration = max(self.iteration, iteration)
                self._append_result(builtin_engine.to_result(self.ctx, rec), rec, iteration)
                last_step = rec["step"]
                self._pass_open = last_step != nsteps - 1
                if last_step == nsteps - 1:
                    passes_done += 1
                    self.failures = 0   # a whole pass: the job is healthy, back-off resets
        except JobTimeout:
            timed_out = True
            error = f"no record for {idle:.0f}s (step_timeout {self.cfg.step_timeout:g}s + launch)"
        except Exception as e:    # the job must never take the daemon down
            error = f"reading the job's output failed: {e}"
            log.exception("reading the job's output failed")
        rc = self._stop_job()
        if self.stopping:
            return True
        if error is None and rc == 0 and passes_done > 0 and not loop:
            return True
        if error is None:
            error = (f"MPI job {builtin_engine.describe_exit(rc)}" if rc != 0 else
                     "MPI job exited before it was stopped" if loop else
                     "MPI job finished without completing the plan")
        step = self.plan[(last_step + 1) % nsteps]
        self._failure(self._summarize(error, job.stderr_tail(_TAIL_LINES), step, timed_out),
                      job.stderr_tail(_TAIL_LINES), step, rc)
        return False

    def _run_steps_job(self):
        """One plan pass, one mpirun per step (engine osu; the built-in engine in bench/)."""
        self.iteration += 1
        self._pass_open = True
        self._write_state("running")
        for step in self.plan:
            if self.stopping:
                return True
            rec, raw = self._run_one_step(step)
            if self.stopping:
                return True
            if rec["type"] == "failure":
                self._failure(rec["error"], rec.get("stderr_tail", ""), step, rec.get("exit_code"))
                return False
            self._append_result(rec, raw, self.iteration)
        self._pass_open = False
        return True

    def _run_one_step(self, step):
        """(result or failure record, CBREC payload or None) for one step in its own job."""
        if self.engine == "osu":
            from collbench import osu_engine
            return osu_engine.run_step(self.cfg, step, self.ctx, self._osu_dir, self._run_mpi_job), None
        from collbench import builtin_engine
        argv, env = builtin_engine.engine_command(
            self.cfg, [step], os.path.join(self.paths.state_dir, "stress-step.txt"),
            validate=self.cfg.validate)
        lines = []
        res = self._run_mpi_job(argv, env, self.cfg.step_timeout + _LAUNCH_SLACK, lines.append)
        recs = [r for r in map(builtin_engine.parse_line, lines) if r is not None]
        if recs and res.returncode == 0 and not res.timed_out:
            return builtin_engine.to_result(self.ctx, recs[0]), recs[0]
        error = ("no record within step_timeout" if res.timed_out else
                 f"MPI job {builtin_engine.describe_exit(res.returncode)}" if res.returncode else
                 "MPI job printed no record")
        summary = self._summarize(error, res.stderr_tail, step, res.timed_out)
        return records.failure_record(self.ctx, summary, res.stderr_tail, step.op, step.size_bytes,
                                      res.returncode), None

    def _run_mpi_job(self, argv, env, idle_timeout, on_line):
        """step_runner.run_job's contract, with our token, output log and stop handling."""
        import subprocess
        job = MpiJob(argv, self._job_env(env), output_log=self.mpi_log)
        self._start_job(job)
        timed_out = False
        try:
            for line in job.lines(idle_timeout):
                on_line(line)
            try:
                job.wait(timeout=idle_timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
        except JobTimeout:
            timed_out = True
        finally:
            self._stop_job()
        return JobResult(job.returncode, timed_out, job.stderr_tail(_TAIL_LINES))

    def _start_job(self, job):
        job.start()
        self.job = job
        self.job_pid = job.pid
        self._write_state("running", force=True)
        if self.stopping:   # a stop that came while we were launching
            _signal_group(job.pid, signal.SIGTERM)

    def _stop_job(self):
        """Make sure the current job is gone (SIGTERM, SIGKILL after stop_grace); its exit code."""
        job = self.job
        if job is None:
            return None
        try:
            killed = job.stop(self.cfg.stress.stop_grace)
            if killed:
                log.warning("SIGKILLed job processes that outlived SIGTERM: %s", killed)
        except Exception:
            log.exception("stopping the MPI job")
        self.job = None
        self.job_pid = None
        return job.returncode

    # ------------------------------------------------------------------ records

    def _append_result(self, rec, raw, iteration):
        rec["iteration"] = iteration
        if raw is not None:   # the engine's wall-clock window of the step (duty cycle, tracing)
            rec["t_start"] = raw["t_start"]
            rec["t_end"] = raw["t_end"]
        self._append(rec)
        self._write_state("running")

    def _failure(self, error, stderr_tail, step, rc):
        rec = records.failure_record(self.ctx, error, stderr_tail or "", op_name=step.op if step else None,
                                     size_bytes=step.size_bytes if step else None, exit_code=rc)
        rec["iteration"] = self._failure_iteration()
        self.last_error = error
        log.warning("job failed: %s", error)
        self._append(rec)

    def _summarize(self, error, tail, step, timed_out):
        """One line: what failed, during which step, and MPI's own words for why."""
        where = ""
        if step is not None:
            where = f" during {step.op}" + (f" {format_size(step.size_bytes)}" if step.size_bytes else "")
        why = "" if timed_out else stderr_reason(tail)
        text = f"{error}{where} (iteration {self._failure_iteration()})"
        if why and why not in text:
            text += f": {why}"
        return " ".join(text.split())[:500]

    def _failure_iteration(self):
        """The plan pass a failure belongs to: the one in progress (next, if none is open)."""
        return self.iteration if self._pass_open else self.iteration + 1

    def _event(self, event, detail, **extra):
        self._append(records.event_record(event, pid=self.pid, detail=detail, run_id=self.ctx.run_id
                                          if self.ctx else None, **extra))

    def _append(self, rec):
        try:
            self.results.append(rec)
            self.records_written += 1
        except OSError as e:   # a full disk must not kill the loop; the gap shows as stale results
            log.error("cannot append to %s: %s", self.paths.results_log, e)

    def _write_state(self, status, force=False):
        self.status = status
        now = time.time()
        if not force and now - self._state_written < _STATE_INTERVAL:
            return
        self._state_written = now
        state = {
            "pid": self.pid, "proc_start": proctree.start_ticks(self.pid), "token": self.token,
            "started": self.started, "updated": now, "status": status, "mode": self.mode,
            "engine": self.engine, "iteration": self.iteration, "config": self.cfg.source,
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
            for p in left:
                _kill(p, signal.SIGKILL)
            killed += left
            time.sleep(0.2)
        _reap_children()
        return sorted(set(killed))


class RawOutputLog:
    """The raw MPI output (mpi-output.log) as the file object MpiJob writes to; past
    max_bytes it moves to mpi-output.log.1 (one old file kept: it is for debugging)."""

    def __init__(self, path, max_bytes):
        self.path = path
        self.max_bytes = max_bytes
        self._f = open(path, "a", encoding="utf-8", errors="replace")

    def write(self, text):
        self._f.write(text)
        if self.max_bytes and self._f.tell() >= self.max_bytes:
            self._f.close()
            os.replace(self.path, self.path + ".1")
            self._f = open(self.path, "a", encoding="utf-8", errors="replace")

    def flush(self):
        self._f.flush()

    def close(self):
        self._f.close()


# Lines of MPI's stderr that say why a job died, most specific first.
def _signal_group(pid, sig):
    """Signal a job's process group (it is started as its own group), or the pid alone."""
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    try:
        if pgid != os.getpgrp():
            os.killpg(pgid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _kill(pid, sig):
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _become_subreaper():
    """Orphaned descendants (ranks whose mpirun died) re-parent to us, not to init."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _reap_children():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
