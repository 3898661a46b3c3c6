"""Run one MPI job: stream its stdout lines, keep the tail of its stderr, stop it for good.

The job leads its own process group and session (start_new_session), so stop() can reach
mpirun, its daemons and the ranks by their process group; it also signals every descendant
found by walking /proc parent links and every process left in the job's session (ranks that a
dying mpirun orphaned), never by name (collbench.proctree.stop_tree). Processes that ignore SIGTERM get SIGKILL after the
grace period; stop() reports their pids.
"""

import collections
import os
import queue
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field

from collbench import proctree

_EOF = object()
STDERR_KEEP = 200   # lines of stderr kept in memory for stderr_tail()
POLL = 0.05         # seconds between checks while a job is stopping


class JobTimeout(Exception):
    """No stdout line arrived within the idle timeout."""

    def __init__(self, idle_timeout):
        super().__init__(f"no output for {idle_timeout:g}s")
        self.idle_timeout = idle_timeout


@dataclass
class JobResult:
    returncode: int
    timed_out: bool
    stderr_tail: str
    killed_pids: list = field(default_factory=list)


# ---------------------------------------------------------------- the job

class MpiJob:
    """One launcher process (mpirun/srun) and everything it starts."""

    def __init__(self, argv, env, output_log=None):
        self.argv = list(argv)
        self.env = env
        self.output_log = output_log
        self.proc = None
        self.pid = None
        self._stdout = queue.Queue()
        self._stderr = collections.deque(maxlen=STDERR_KEEP)
        self._log_lock = threading.Lock()
        self._readers = []
        self._known = {}  # pid -> starttime of every process seen in the job
        self._start_time = None

    @property
    def returncode(self):
        return None if self.proc is None else self.proc.returncode

    def start(self):
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, bufsize=1, errors="replace",
            start_new_session=True)
        self.pid = self.proc.pid
        self._start_time = proctree.start_ticks(self.pid)
        for stream, sink, tag in ((self.proc.stdout, self._stdout.put, "out"),
                                  (self.proc.stderr, self._stderr.append, "err")):
            t = threading.Thread(target=self._read, args=(stream, sink, tag),
                                 name=f"mpijob-{self.pid}-{tag}", daemon=True)
            t.start()
            self._readers.append(t)
        return self

    def _read(self, stream, sink, tag):
        try:
            for line in stream:
                line = line.rstrip("\n")
                self._log(tag, line)
                sink(line)
        except (OSError, ValueError):
            pass
        finally:
            if tag == "out":
                self._stdout.put(_EOF)

    def _log(self, tag, line):
        if self.output_log is None:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with self._log_lock:
            try:
                self.output_log.write(f"{stamp} [{self.pid} {tag}] {line}\n")
                self.output_log.flush()
            except (OSError, ValueError):
                pass  # a full disk or a closed log must not stop the job's streams

    def lines(self, idle_timeout):
        """Yield stdout lines (without newline) until EOF; JobTimeout after idle_timeout s of silence."""
        while True:
            try:
                item = self._stdout.get(timeout=idle_timeout)
            except queue.Empty:
                raise JobTimeout(idle_timeout) from None
            if item is _EOF:
                self._stdout.put(_EOF)  # later calls see EOF again
                return
            yield item

    def stderr_tail(self, n=20):
        """The last n lines of stderr, after the launcher's first lines on a host it could not
        reach (ssh: Could not resolve hostname ...) when Open MPI's banners pushed them out."""
        kept = list(self._stderr)
        cause = [ln for ln in kept[:-n] if _LAUNCH_FAILED.search(ln.strip()) and not _NOT_A_CAUSE.search(ln)][:2]
        return "\n".join(cause + kept[-n:])

    def descendants(self):
        """Pids of the job's live process tree below the launcher."""
        return proctree.descendants(self.pid) if self.pid else []

    def _owns_ids(self, launcher_stat):
        """False once the launcher's pid names another process: that session and group are not ours."""
        return launcher_stat is None or launcher_stat.start_ticks == self._start_time

    def _remember_tree(self):
        """Record the job's processes: descendants of the launcher and its session's members."""
        stats = proctree.all_stats()
        if self._owns_ids(stats.get(self.pid)):
            pids = set(proctree.descendants(self.pid, stats)) | {
                pid for pid, st in stats.items() if st.sid == self.pid and proctree.is_running(st)}
            if proctree.is_running(stats.get(self.pid)):
                pids.add(self.pid)
            for pid in pids:
                self._known.setdefault(pid, stats[pid].start_ticks)
        return [p for p, start in self._known.items() if proctree.same_process(p, start)]

    def _group(self):
        """The job's process group while its launcher's pid is still the launcher's (else None)."""
        return self.pid if self._owns_ids(proctree.read_stat(self.pid)) else None

    def _live(self):
        """{pid: start ticks} of the job's processes still running."""
        return {pid: self._known[pid] for pid in self._remember_tree()}

    def stop(self, grace=10.0):
        """SIGTERM the whole job, SIGKILL what is left after grace s, reap; pids that needed SIGKILL."""
        if self.proc is None:
            return []
        killed = proctree.stop_tree(self._live, grace, groups=self._group, on_wait=self.proc.poll, poll=POLL)
        self.proc.wait()
        self.reap_adopted()
        self._join_readers()
        return killed

    def reap_adopted(self):
        """Reap the job's processes that ended as our children: ranks orphaned by a dying mpirun
        re-parent to a child subreaper (the stress daemon) and stay zombies until it waits for
        them. Only pids of this job (its session, or seen in its tree): never another's child."""
        me = os.getpid()
        reaped = []
        for pid in proctree.child_pids(me):
            st = proctree.read_stat(pid)
            if st is None or st.state != "Z" or pid == self.pid:
                continue
            if st.sid == self.pid or self._known.get(pid) == st.start_ticks:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        reaped.append(pid)
                except ChildProcessError:
                    pass
        return reaped

    def wait(self, timeout=None):
        """Wait for the launcher to exit; its return code (negative: killed by that signal)."""
        rc = self.proc.wait(timeout)
        self._join_readers(timeout=5.0)
        return rc

    def _join_readers(self, timeout=5.0):
        # orphans that kept the pipes open are gone after stop(); bound the join anyway
        for t in self._readers:
            t.join(timeout)


# mpirun's own account of a dead rank, worth more than any other line of its stderr
_RANK_DIED = re.compile(r"noticed that process rank \d+ .*(exited|signal)|exited on signal \d+")
# what the launcher (ssh, rsh) says when it cannot reach a host: the cause behind Open MPI's
# "ORTE was unable to reliably start one or more daemons" and "does not know how to route" boxes
_LAUNCH_FAILED = re.compile(r"^(?:ssh|rsh)\b.*:|^srun: error:|Could not resolve hostname|Permission denied"
                            r"|Host key verification failed|Connection (?:refused|timed out|closed)"
                            r"|No route to host|Name or service not known|command not found", re.I)
# Open MPI's warnings that are true of healthy jobs too, never a failure's cause: plm rsh's
# setpgid in the parent fails (EACCES) when the child has already exec'd ssh, a race a loaded
# machine wins now and then; its "Permission denied" must not pass for ssh's
_NOT_A_CAUSE = re.compile(r"plm:\w+: Warning: setpgid\(")
# Open MPI's note that it aggregated its help messages: true of every failure, says nothing
_BOILERPLATE = re.compile(r'Set MCA parameter "?orte_base_help_aggregate|more process(?:es)? ha(?:s|ve) sent help message')
# the lines of an Open MPI box that name the host concerned ("target node:  n2", "Node: n2")
_BOX_NODE = re.compile(r"^(?:target node|node|host|hostname):\s*(\S+)$", re.I)


def _boxes(lines):
    """(lines outside mpirun's ----- boxes, [lines of each box]). The tail kept of a job's stderr
    may start inside a box, so the separators are paired from the end (a job's stderr ends
    after its last box closed); a box whose opening was cut off is dropped."""
    seps = [i for i, ln in enumerate(lines) if ln and set(ln) <= set("-=")]
    if len(seps) % 2:                 # the first separator closes a box whose start was cut off
        cut, seps = seps[0] + 1, seps[1:]
    else:
        cut = 0
    outside, boxes, prev = [], [], cut
    for a, b in zip(seps[::2], seps[1::2]):
        outside += [ln for ln in lines[prev:a] if ln]
        boxes.append([ln for ln in lines[a + 1:b]])
        prev = b + 1
    outside += [ln for ln in lines[prev:] if ln]
    return outside, boxes


def _box_headline(box):
    """An Open MPI box's first paragraph in one line, and the node it names, if any."""
    para = []
    for ln in box:
        if not ln and para:
            break
        if ln:
            para.append(ln)
    text = " ".join(para)[:300]
    nodes = [m.group(1) for m in (_BOX_NODE.match(ln) for ln in box) if m]
    if nodes:
        text += f" ({', '.join(f'node {n}' for n in nodes[-1:])})"
    return text


def stderr_reason(stderr_tail, program_prefix="collbench-engine:"):
    """The one line of a job's stderr that best says what went wrong ("" if none).

    mpirun's note of a rank that died wins; then the program's own last message (lines
    starting with program_prefix; None for programs without one, such as OSU); then what the
    launcher said of a host it could not reach (ssh: Could not resolve hostname ...), never a
    warning that healthy jobs print too (plm rsh's setpgid); then the
    last line outside mpirun's ----- boxes; then the first paragraph of the first whole box
    (Open MPI's banners end in boilerplate such as "We apologize for the problem": never that).
    """
    lines = [ln.strip() for ln in (stderr_tail or "").splitlines() if not _NOT_A_CAUSE.search(ln)]
    for ln in lines:
        if _RANK_DIED.search(ln):
            return ln
    own = [ln for ln in lines if program_prefix and ln.startswith(program_prefix)]
    if own:
        return own[-1]
    launch = [ln for ln in lines if _LAUNCH_FAILED.search(ln)]
    if launch:
        return launch[0]
    outside, boxes = _boxes(lines)
    outside = [ln for ln in outside if not _BOILERPLATE.search(ln)]
    if outside:
        return outside[-1]
    for box in boxes:
        headline = _box_headline(box)
        if headline:
            return headline
    return ""


def describe_exit(returncode):
    """'exited with code N', 'was killed by signal N' or 'did not exit' (a Popen return code)."""
    if returncode is None:
        return "did not exit"
    if returncode < 0:
        return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


class JobRunner:
    """How an engine starts, waits for and stops its MPI jobs.

    `once` (and any caller of Engine.run_steps) gets this one. The stress daemon passes a
    subclass that puts its token in the jobs' environment, writes their output to
    mpi-output.log and keeps track of the running job so a stop request reaches it.
    """

    stderr_tail_lines = 20   # lines of MPI's stderr a failure record keeps
    launch_slack = 0.0       # seconds allowed beyond step_timeout for a line (a launch over ssh)

    def __init__(self, output_log=None, stop_grace=10.0):
        self.output_log = output_log
        self.stop_grace = stop_grace

    def idle_timeout(self, cfg):
        """Seconds a job may stay silent before it is stopped as hung."""
        return cfg.step_timeout + self.launch_slack

    def start(self, argv, env):
        """A started MpiJob."""
        return MpiJob(argv, env, self.output_log).start()

    def stop(self, job):
        """Stop the job (SIGTERM, SIGKILL after the grace period); pids that needed SIGKILL."""
        return job.stop(self.stop_grace)

    def finish(self, job):
        """The caller is done with the job, however it ended: make sure it is gone."""
        if job.returncode is None:   # the consumer stopped reading, or an exception
            self.stop(job)

    def run(self, argv, env, idle_timeout, on_line):
        """Run a job to completion, calling on_line(line) per stdout line; stop it if it goes
        silent for idle_timeout s. A JobResult."""
        job = self.start(argv, env)
        timed_out, killed = False, []
        try:
            for line in job.lines(idle_timeout):
                on_line(line)
            try:
                job.wait(timeout=idle_timeout)  # stdout closed: the launcher should exit promptly
            except subprocess.TimeoutExpired:
                timed_out = True
                killed = self.stop(job)
        except JobTimeout:
            timed_out = True
            killed = self.stop(job)
        finally:
            self.finish(job)
        return JobResult(job.returncode, timed_out, job.stderr_tail(self.stderr_tail_lines), killed)


def run_job(argv, env, idle_timeout, on_line, output_log=None, stop_grace=10.0):
    """Run a job to completion, calling on_line(line) per stdout line; stop it if it goes silent."""
    return JobRunner(output_log, stop_grace).run(argv, env, idle_timeout, on_line)
