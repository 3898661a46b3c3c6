"""Starting the local daemon: `stress start` (double fork, setsid, stdio to daemon.log, wait
until it is up) and `stress run` (the same daemon in the foreground, systemd's Type=notify)."""

import logging
import os
import socket
import sys
import time

from collbench.errors import UserError
from collbench.results.state_dir import CRASHED, RUNNING, AlreadyRunning, daemon_status
from collbench.tables import format_duration

EXIT_START_FAILED = 1


def _preflight(cfg, daemon):
    """Fail in the terminal, not in daemon.log: launcher, engine (binary, plan)."""
    from collbench.engines import launcher
    launcher.mpi_version(cfg)   # the launcher exists (UserError naming it otherwise)
    daemon.engine.preflight(cfg, daemon.plan)


def start(args, cfg, paths):
    """`stress start`: check everything in the foreground, then daemonize and wait until it is up."""
    from collbench.stress.daemon import Daemon
    st = daemon_status(paths, scan=True)
    if st.state == RUNNING:
        print(f"collbench stress: already running (pid {st.pid}, up {format_duration(time.time() - st.info.get('started', time.time()))}, "
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


def run(cfg, paths):
    """`stress run`: the same daemon in the foreground (systemd, containers, debugging)."""
    from collbench.stress.daemon import Daemon
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
