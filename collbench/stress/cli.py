"""`collbench stress start|stop|status|log|servers|run`: the stress daemon's verbs.

start   check everything in the foreground (config, launcher, engine), then daemonize
        (double fork, setsid, stdio to daemon.log) and wait until the daemon is up
run     the same daemon in the foreground (systemd, containers, debugging)
stop    SIGTERM the daemon (it stops its job); SIGKILL after stress.stop_grace; confirm by pid
status  running (0) / crashed (1) / stopped (3), like LSB init scripts; --json for machines
log     recent records, readable; -f follows across rotations
servers benchmark processes and their CPU on the configured hosts that are this machine
"""

import json
import logging
import os
import re
import signal
import socket
import sys
import time

from collbench import proctree
from collbench.cli import add_config_arg
from collbench.config import load_config
from collbench.errors import UserError
from collbench.hosts import is_this_machine
from collbench.tables import format_us
from collbench.stress import processes, slurm_job
from collbench.results.follower import LogFollower
from collbench.results.results_log import tail_records
from collbench.results.state_dir import (CRASHED, RUNNING, STOPPED, AlreadyRunning, StatePaths, daemon_status,
                                    is_daemon, read_state, remove_pid_file, write_json_atomic)

EXIT_START_FAILED = 1


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


# ---------------------------------------------------------------- config / paths

def resolve(args):
    """(cfg, StatePaths) from --config and --state-dir (paths made absolute: start chdirs to /)."""
    cfg = load_config(args.config)
    if os.path.isfile(cfg.source):
        cfg.source = os.path.abspath(cfg.source)
    return cfg, StatePaths.for_config(cfg, args.state_dir)


def _results_path(paths, info):
    """The log the daemon writes: as recorded in its state file, else from the config."""
    return (info or {}).get("results_log") or paths.results_log


def _preflight(cfg, daemon):
    """Fail in the terminal, not in daemon.log: launcher, engine (binary, plan)."""
    from collbench.engines import launcher
    launcher.resolve_launcher(cfg)
    daemon.engine.preflight(cfg, daemon.plan)


# ---------------------------------------------------------------- start / run

def cmd_start(args):
    code = slurm_job.dispatch("start", args)
    if code is not None:
        return code
    from collbench.stress.daemon import Daemon
    cfg, paths = resolve(args)
    st = daemon_status(paths, scan=True)
    if st.state == RUNNING:
        print(f"collbench stress: already running (pid {st.pid}, up {processes.format_duration(time.time() - st.info.get('started', time.time()))}, "
              f"state dir {paths.state_dir}{'; ' + st.reason if st.reason else ''}); "
              "not starting a second daemon", file=sys.stderr)
        return EXIT_START_FAILED
    paths.ensure()
    daemon = Daemon(cfg, paths)
    _preflight(cfg, daemon)
    if st.state == CRASHED:
        print(f"collbench stress: previous daemon crashed ({st.reason}); replacing its pid file", file=sys.stderr)

    ready_r, ready_w = os.pipe()
    first = os.fork()
    if first == 0:   # first child: new session, then fork again so the daemon can never get a tty
        os.close(ready_r)
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            os.setpgid(0, 0)
            _daemon_main(cfg, paths, ready_w)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.waitpid(first, 0)
    message = _read_ready(ready_r, args.wait)
    if message.startswith("ok "):
        pid = int(message.split()[1])
        print(f"collbench stress: started (pid {pid}, mode {daemon.mode}, {len(daemon.plan)} steps, "
              f"{cfg.ranks} ranks on {','.join(cfg.placement())})")
        print(f"  results: {paths.results_log}")
        print(f"  logs:    {paths.daemon_log}, {paths.mpi_output}")
        return 0
    print(f"collbench stress: failed to start: {message or 'no word from the daemon'} "
          f"(see {paths.daemon_log})", file=sys.stderr)
    return EXIT_START_FAILED


def _read_ready(fd, timeout):
    import select
    data = b""
    end = time.monotonic() + timeout
    while b"\n" not in data:
        left = end - time.monotonic()
        if left <= 0:
            return "timed out waiting for the daemon to come up"
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return data.decode("utf-8", "replace").strip()


def _daemon_main(cfg, paths, ready_w):
    """The daemonized process: stdio to daemon.log, run, tell `start` when it is up."""
    from collbench.stress.daemon import Daemon
    os.chdir("/")
    os.umask(0o022)
    # Hold nothing of the session that started us (an SSH channel, a terminal) open.
    maxfd = os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 1024
    os.closerange(3, ready_w)
    os.closerange(ready_w + 1, min(maxfd, 65536))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    out = os.open(paths.daemon_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    _setup_logging()

    def ready(pid):
        os.write(ready_w, f"ok {pid}\n".encode())
        os.close(ready_w)

    code = 1
    try:
        code = Daemon(cfg, paths).run(on_ready=ready)
    except AlreadyRunning as e:
        _tell(ready_w, str(e))
    except UserError as e:
        _tell(ready_w, str(e))
        logging.getLogger("collbench.stress").error("%s", e)
    except BaseException as e:   # noqa: B902 - the daemon's last words go to daemon.log
        logging.getLogger("collbench.stress").exception("daemon failed")
        _tell(ready_w, f"{type(e).__name__}: {e}")
    os._exit(code)


def _tell(fd, message):
    try:
        os.write(fd, (message.replace("\n", " ") + "\n").encode())
        os.close(fd)
    except OSError:
        pass


def _setup_logging():
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")


def cmd_run(args):
    from collbench.stress.daemon import Daemon
    cfg, paths = resolve(args)
    _setup_logging()
    paths.ensure()
    daemon = Daemon(cfg, paths)
    _preflight(cfg, daemon)
    try:
        return daemon.run(on_ready=lambda pid: _sd_notify(f"READY=1\nMAINPID={pid}"))
    except AlreadyRunning as e:
        print(f"collbench stress: {e}", file=sys.stderr)
        return EXIT_START_FAILED


def _sd_notify(message):
    """Tell systemd (Type=notify) we are up; a no-op outside systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]   # abstract socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(message.encode(), addr)
    except OSError as e:
        logging.getLogger("collbench.stress").warning("sd_notify failed: %s", e)


# ---------------------------------------------------------------- stop

def cmd_stop(args):
    code = slurm_job.dispatch("stop", args)
    if code is not None:
        return code
    cfg, paths = resolve(args)
    st = daemon_status(paths, scan=True)
    token = st.info.get("token")
    if st.state == RUNNING:
        if st.reason:   # found in /proc, not by its pid file
            print(f"collbench stress: daemon pid {st.pid} found by its lock: {st.reason}", file=sys.stderr)
        t0 = time.monotonic()
        try:
            os.kill(st.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        except PermissionError:
            raise UserError(f"not permitted to signal the daemon (pid {st.pid}): run `stress stop` as "
                            f"its user or root (under systemd: systemctl stop collbench-stress)") from None
        grace = cfg.stress.stop_grace + 5.0   # the daemon itself gives its job stop_grace
        while time.monotonic() - t0 < grace and _daemon_alive(st):
            time.sleep(0.1)
        escalated = _daemon_alive(st)
        if escalated:
            print(f"collbench stress: daemon pid {st.pid} still running {grace:.0f}s after SIGTERM: SIGKILL",
                  file=sys.stderr)
            proctree.signal_tree(None, signal.SIGKILL, [st.pid])
        killed = _kill_token(token)
        left = _wait_gone([st.pid] + killed, 5.0)
        if left:
            print(f"collbench stress: could not stop pid(s) {', '.join(map(str, left))}", file=sys.stderr)
            return 1
        if escalated:
            _mark_stopped(paths, st.info, "killed by `stress stop` after the grace period")
            remove_pid_file(paths)
        extra = f"; killed {len(killed)} leftover process(es)" if killed else ""
        print(f"collbench stress: stopped (pid {st.pid}, {time.monotonic() - t0:.1f}s){extra}")
        return 0
    killed = _kill_token(token)
    left = _wait_gone(killed, 5.0)
    if st.state == CRASHED:
        remove_pid_file(paths)
        _mark_stopped(paths, st.info, f"cleaned up after a crash ({st.reason})")
        msg = f"collbench stress: was not running ({st.reason}); removed the stale pid file"
    else:
        msg = "collbench stress: not running"
    if killed:
        msg += f"; killed {len(killed)} process(es) the dead daemon left: {', '.join(map(str, killed))}"
    print(msg)
    return 1 if left else 0


def _daemon_alive(st):
    return is_daemon(st.pid, st.info.get("proc_start"))


def _kill_token(token):
    """SIGKILL every process carrying the daemon's token (its job's processes); their pids."""
    if not token:
        return []
    pids = [p for p in processes.token_pids(token) if proctree.pid_alive(p)]
    proctree.signal_tree(None, signal.SIGKILL, pids)
    return pids


def _wait_gone(pids, timeout):
    end = time.monotonic() + timeout
    while True:
        left = [p for p in pids if proctree.pid_alive(p)]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)


def _mark_stopped(paths, info, why):
    if not info:
        return
    info = dict(info, status=STOPPED, updated=time.time(), job_pid=None, stop_reason=why)
    try:
        write_json_atomic(paths.state, info)
    except OSError:
        pass


# ---------------------------------------------------------------- status

def cmd_status(args):
    code = slurm_job.dispatch("status", args)
    if code is not None:
        return code
    cfg, paths = resolve(args)
    st = daemon_status(paths, scan=True)
    info = st.info
    results = _results_path(paths, info)
    last = last_results(results)
    leftovers = []
    if st.state != RUNNING and info.get("token"):
        leftovers = processes.token_pids(info["token"])
    if args.json:
        out = {"state": st.state, "pid": st.pid, "reason": st.reason, "state_dir": paths.state_dir,
               "results_log": results, "uptime_s": (time.time() - info["started"])
               if st.state == RUNNING and info.get("started") else None,
               "iteration": info.get("iteration"), "leftover_pids": leftovers,
               "daemon": info, "last_results": last["results"], "last_failure": last["failure"],
               "bad_lines": last["bad_lines"]}
        print(json.dumps(out, indent=1, sort_keys=True))
        return st.exit_code
    print("\n".join(render_status(st, paths, results, last, leftovers)))
    return st.exit_code


STATUS_TAIL_BYTES = 64 << 20    # status reads at most this much of the log's end


def last_results(results_path, max_records=20000):
    """The newest result per (op, size) and the newest failure, from the log's tail; and the
    lines met there that are not valid records (`bad_lines`: count, first)."""
    bad = BadLines(show=0)
    try:
        recs = tail_records(results_path, max_records, on_bad=bad, max_bytes=STATUS_TAIL_BYTES) \
            if results_path else []
    except OSError as e:   # status still reports the daemon; the log's fault is one more line
        print(f"collbench stress: cannot read the results log {results_path}: {e.strerror or e}",
              file=sys.stderr, flush=True)
        recs = []
    latest, failure, event = {}, None, None
    for r in recs:
        t = r.get("type")
        if t == "result":
            latest[(r.get("op"), r.get("size_bytes"))] = r
        elif t == "failure":
            failure = r
        elif t == "event":
            event = r
    return {"results": list(latest.values()), "failure": failure, "event": event,
            "bad_lines": {"count": bad.count, "first": bad.first}}


class BadLines:
    """on_bad for the results log readers: counts the lines that are not valid records
    (collbench.results.record_parser) and names the first `show` of them on stderr."""

    def __init__(self, show=5):
        self.show = show
        self.count = 0
        self.first = None

    def __call__(self, path, offset, reason):
        self.count += 1
        where = f"{path} byte {offset}: {reason}"
        if self.first is None:
            self.first = where
        if self.count <= self.show:
            print(f"collbench stress: skipped a line that is not a valid record: {where}"
                  + ("; further ones are only counted" if self.count == self.show else ""),
                  file=sys.stderr, flush=True)

    def summary(self):
        return (f"collbench stress: skipped {self.count} line(s) that are not valid records "
                f"(docs/LOG_FORMAT.md, Validation); first: {self.first}")


def render_status(st, paths, results, last, leftovers):
    info, now = st.info, time.time()
    lines = []
    if st.state == RUNNING:
        lines.append(f"collbench stress: running (pid {st.pid}, up {processes.format_duration(now - info.get('started', now))}, "
                     f"iteration {info.get('iteration', 0)}, {info.get('status', '?')})")
        lines.append(f"  mode {info.get('mode')}, engine {info.get('engine')}, job pid {info.get('job_pid') or '-'}, "
                     f"relaunches {info.get('relaunches', 0)}, state updated {processes.format_duration(now - info.get('updated', now))} ago")
        if st.reason:   # found in /proc by its lock, not by its files
            lines.append(f"  WARNING: {st.reason}; the daemon recreates it within seconds "
                         "(`collbench stress stop` stops it)")
    elif st.state == CRASHED:
        lines.append(f"collbench stress: crashed ({st.reason})")
        if info.get("updated"):
            lines.append(f"  last state update {processes.format_duration(now - info['updated'])} ago at iteration {info.get('iteration', 0)}; "
                         "`collbench stress start` replaces the stale pid file, `stop` cleans up")
    else:
        lines.append("collbench stress: stopped")
        if info.get("updated"):
            lines.append(f"  last ran until {processes.format_duration(now - info['updated'])} ago "
                         f"({info.get('stop_reason') or 'clean stop'}), iteration {info.get('iteration', 0)}")
    if leftovers:
        lines.append(f"  WARNING: {len(leftovers)} process(es) of the dead daemon still running: "
                     f"{', '.join(map(str, leftovers))} (`collbench stress stop` kills them)")
    lines.append(f"  state dir {paths.state_dir}")
    lines.append(f"  results   {results}")
    if info.get("config"):
        lines.append(f"  config    {info['config']}")
    fail = last["failure"]
    if fail:
        lines.append(f"  last failure {processes.format_duration(now - fail.get('ts', now))} ago: "
                     f"{printable(fail.get('error'))}")
    bad = last.get("bad_lines") or {}
    if bad.get("count"):
        lines.append(f"  WARNING: {bad['count']} line(s) at the end of the results log are not valid records "
                     f"(skipped; first: {bad['first']})")
    res = sorted(last["results"], key=lambda r: (str(r.get("op")), r.get("size_bytes") or 0))
    if not res:
        lines.append("  no results yet")
        return lines
    lines.append("")
    lines.append(f"  {'OP':<15}{'SIZE':>7}{'AVG':>12}{'MAX':>12}{'BUSBW':>12}  {'VERDICT':<9}{'ITER':>6}{'AGE':>9}")
    for r in res:
        lines.append(f"  {r.get('op', '?'):<15}{r.get('size', '?'):>7}{format_us(r.get('latency_avg_us')):>12}"
                     f"{format_us(r.get('latency_max_us')):>12}{_bw(r.get('busbw_bytes_per_s')):>12}  "
                     f"{str(r.get('verdict') or '-'):<9}{str(r.get('iteration', '-')):>6}"
                     f"{processes.format_duration(now - r.get('ts', now)):>9}")
    return lines


# ---------------------------------------------------------------- log

def cmd_log(args):
    cfg, paths = resolve(args)
    if args.lines < 0:
        raise UserError(f"--lines: got {args.lines}, expected a number >= 0")
    st = daemon_status(paths)
    path = _results_path(paths, st.info)
    if not os.path.exists(path) and not args.follow:
        print(f"collbench stress: no results log yet at {path}", file=sys.stderr)
        return 1
    show = (lambda r: print(json.dumps(r, separators=(",", ":")))) if args.json else \
        (lambda r: print(format_record(r)))
    bad = BadLines()
    if os.path.exists(path):
        try:
            recs = tail_records(path, args.lines, on_bad=bad)
        except OSError as e:
            raise UserError(f"results log {path}: cannot read: {e.strerror or e}") from None
        for r in recs:
            show(r)
    sys.stdout.flush()
    if bad.count:
        print(bad.summary(), file=sys.stderr, flush=True)
    if args.follow:
        shown = bad.count
        try:
            follow(path, show, on_bad=bad)
        finally:   # Ctrl-C: say how many followed lines were skipped
            if bad.count > shown:
                print(bad.summary(), file=sys.stderr, flush=True)
    return 0


def follow(path, show, poll=0.5, stop=None, on_bad=None):
    """Show records appended to `path`, across rename rotations, until interrupted."""
    follower = LogFollower(path, on_bad=on_bad)
    try:
        while stop is None or not stop():
            recs = follower.poll()
            for r in recs:
                show(r)
            if recs:
                sys.stdout.flush()
            else:
                time.sleep(poll)
    finally:
        follower.close()


def format_record(r):
    t = r.get("type")
    when = r.get("time", "?")
    seq = r.get("seq")
    head = f"{when} #{seq}" if seq is not None else when
    if t == "result":
        bw = _bw(r.get("busbw_bytes_per_s"))
        return (f"{head} it={r.get('iteration', '-')} {r.get('op', '?'):<14} {r.get('size', '?'):>6} "
                f"avg {format_us(r.get('latency_avg_us')):>10}  max {format_us(r.get('latency_max_us')):>10}  "
                f"busbw {bw:>11}  {r.get('verdict') or '-'}"
                + (f"  validation {r['validation']}" if r.get("validation") not in (None, "off") else ""))
    if t == "failure":
        return f"{head} it={r.get('iteration', '-')} FAILED (exit {r.get('exit_code')}): {printable(r.get('error'))}"
    if t == "event":
        return f"{head} event {r.get('event')} pid {r.get('pid')}: {printable(r.get('detail') or '')}"
    return f"{head} {json.dumps(r)}"


# ---------------------------------------------------------------- servers

def cmd_servers(args):
    cfg, paths = resolve(args)
    info = read_state(paths) or {}
    token = info.get("token")
    data, out, shown = None, [], None
    for host in cfg.host_names:
        if is_this_machine(host):
            if data is None:
                data = processes.collect(interval=args.interval, token=token)
                shown = host
                out.append({"host": host, "local": True, "data": data})
            else:
                out.append({"host": host, "local": True, "same_as": shown})
        else:
            out.append({"host": host, "local": False})
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for item in out:
        if item.get("data"):
            print("\n".join(processes.format_host(item["host"], item["data"])))
        elif item.get("same_as"):
            print(f"{item['host']}: this machine (shown under {item['same_as']})")
        else:
            print(f"{item['host']}: remote host; `collbench ctl` queries it over SSH")
    return 0


# ---------------------------------------------------------------- formatting

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text):
    """Free text from the log (error, detail) for a terminal: control characters escaped, so
    a record cannot move the cursor or retitle the window."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def _bw(bps):
    if bps is None:
        return "-"
    return f"{bps / 1e9:.2f} GB/s" if bps >= 1e8 else f"{bps / 1e6:.1f} MB/s"
