"""collbench verbs on the master over SSH.

Every verb becomes a `collbench` command line run on the master by its installed interpreter
(`<remote_dir>/.venv/bin/python -m collbench ...`), wrapped in `collbench.ctl.agent` so that its
output streams back and Ctrl-C (or a lost connection) stops it and everything it started.
Values only ever travel as argv words, quoted by ssh.remote_command.
"""

import json
import os
import posixpath
import sys
import time

import paramiko

from collbench import __version__
from collbench.ctl import ssh
from collbench.errors import UserError

# Commands that outlive Ctrl-C get this long to stop on the master before the controller gives up.
CANCEL_WAIT = 30.0


def remote_python(master):
    return posixpath.join(master.remote_dir, ".venv", "bin", "python")


def remote_config_path(master):
    """Where the config lives on the master: master.remote_config, or the uploaded copy."""
    return master.remote_config or posixpath.join(master.remote_dir, "etc", "collbench.yaml")


def load(args):
    """The config of a `ctl` command, with --host over master.host."""
    from collbench.config import load_config
    cfg = load_config(args.config)
    if args.host:
        cfg.master.host = args.host
    return cfg


def is_remote(cfg, args):
    return bool(cfg.master.host) and not args.local


def open_master(cfg, args):
    return Master(cfg, accept_new_host_key=args.accept_new_host_key, ask_password=args.ask_password)


class Master:
    """An SSH session to the config's master host, with collbench's remote conventions."""

    def __init__(self, cfg, accept_new_host_key=False, ask_password=False, conn=None):
        self.cfg = cfg
        self.master = cfg.master
        self.target = ssh.target_from_master(cfg.master)
        self.accept_new_host_key = accept_new_host_key
        self.ask_password = ask_password
        self.conn = conn
        self.python = remote_python(cfg.master)

    def __enter__(self):
        self.connect()
        return self

    def __exit__(self, *exc):
        self.close()

    def connect(self):
        if self.conn is None:
            self.conn = ssh.connect(self.target, self.accept_new_host_key, self.ask_password)
            if self.conn.accepted_key:
                print(f"collbench: added {self.target.host_entry} {self.conn.accepted_key} to "
                      f"{self.target.known_hosts[0]}", file=sys.stderr)
        return self.conn

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    # ----------------------------------------------------------- what is installed there

    def probe(self):
        """{version, python, hostname} of collbench on the master, or RemoteCollbenchMissingError."""
        code = ("import collbench, json, socket, sys; print(json.dumps({'version': collbench.__version__, "
                "'python': sys.version.split()[0], 'hostname': socket.gethostname()}))")
        res = self.connect().run([self.python, "-c", code], timeout=self.master.connect_timeout * 3)
        if res.returncode != 0:
            why = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise ssh.RemoteCollbenchMissingError(
                f"collbench is not installed on {self.target.hostname} at {self.master.remote_dir} "
                f"({self.python}: {why}). Run `collbench ctl deploy`, or set master.remote_dir "
                "to where it is installed")
        try:
            info = json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise ssh.RemoteCollbenchMissingError(
                f"{self.python} on {self.target.hostname} did not answer as collbench: {res.stdout[:200]!r}") from None
        if info.get("version") != __version__:
            print(f"collbench: warning: {self.target.hostname} runs collbench {info.get('version')}, this is "
                  f"{__version__}; `collbench ctl deploy` updates it", file=sys.stderr)
        return info

    def collbench_argv(self, *args):
        return [self.python, "-m", "collbench", *args]

    # ----------------------------------------------------------- the config on the master

    def config_path(self):
        return remote_config_path(self.master)

    def upload_config(self):
        """Upload the local config (and a hostfile it names by relative path) to the master."""
        if self.cfg.source == "<default>":
            raise UserError("the controller needs a config file (--config) naming master.host")
        remote = self.config_path()
        conn = self.connect()
        conn.put_file(self.cfg.source, remote, mode=0o600)
        rel = _relative_hostfile(self.cfg)
        if rel is not None:
            local = os.path.join(os.path.dirname(os.path.abspath(self.cfg.source)), rel)
            conn.put_file(local, posixpath.join(posixpath.dirname(remote), *rel.split(os.sep)), mode=0o644)
        return remote

    def prepare_config(self, upload=None):
        """The remote config path to pass to remote verbs, uploading the local copy when it is ours."""
        if upload is None:
            upload = self.master.remote_config is None
        return self.upload_config() if upload else self.config_path()

    # ----------------------------------------------------------- running verbs

    def stream(self, argv, timeout=None, stdout=None, stderr=None):
        """Run argv on the master under the agent, relaying its output as it comes.

        Returns its exit status. Ctrl-C cancels it on the master (process group and tree
        stopped), waits for that, then raises KeyboardInterrupt.
        """
        stdout = stdout or sys.stdout.buffer
        stderr = stderr or sys.stderr.buffer
        grace = float(getattr(self.cfg.stress, "stop_grace", 10.0))
        wrapped = [self.python, "-m", "collbench.ctl.agent", "--grace", f"{grace:g}", "--", *argv]
        chan = self.connect().open_channel(wrapped)
        deadline = None if timeout is None else time.monotonic() + timeout
        interrupted = None
        try:
            while True:
                try:
                    if _pump(chan, stdout, stderr):
                        break
                    if deadline is not None and time.monotonic() > deadline:
                        _cancel(chan, stdout, stderr, grace)
                        raise ssh.SSHTimeoutError(
                            f"remote command did not finish within {timeout:g}s and was stopped on "
                            f"{self.target.hostname}: {ssh.remote_command(argv)[:200]}")
                except KeyboardInterrupt as e:
                    interrupted = e
                    print(f"\ncollbench: cancelling on {self.target.hostname} ...", file=sys.stderr, flush=True)
                    _cancel(chan, stdout, stderr, grace)
                    break
            rc = chan.recv_exit_status() if chan.exit_status_ready() else None
        finally:
            chan.close()
        if interrupted is not None:
            raise interrupted
        if rc is None or rc == -1:
            raise ssh.HostUnreachableError(
                f"lost the connection to {self.target.describe()} while running "
                f"{ssh.remote_command(argv)[:200]}; the command was stopped there")
        if rc == 127:
            # the agent could not start (interpreter or module missing)
            self.probe()
        return rc

    def capture(self, argv, timeout=None):
        """Run argv under the agent and return (rc, stdout text); stderr is relayed."""
        import io
        buf = io.BytesIO()
        rc = self.stream(argv, timeout=timeout, stdout=buf)
        return rc, buf.getvalue().decode("utf-8", "replace")


def _pump(chan, stdout, stderr, wait=0.05):
    """Move what the channel has to stdout/stderr; True when the command is finished."""
    got = False
    while chan.recv_ready():
        stdout.write(chan.recv(65536))
        got = True
    while chan.recv_stderr_ready():
        stderr.write(chan.recv_stderr(65536))
        got = True
    if got:
        stdout.flush()
        stderr.flush()
    if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
        return True
    if chan.closed:
        return True
    if not got:
        time.sleep(wait)
    return False


def _cancel(chan, stdout, stderr, grace):
    """Tell the agent to stop the command, then wait (bounded) for it to report back."""
    try:
        chan.sendall(b"cancel\n")
        chan.shutdown_write()
    except (OSError, paramiko.SSHException):
        return
    deadline = time.monotonic() + grace + CANCEL_WAIT
    while time.monotonic() < deadline:
        try:
            if _pump(chan, stdout, stderr):
                return
        except KeyboardInterrupt:
            print("collbench: still stopping the remote command; Ctrl-C again leaves the agent "
                  "to finish the job on its own", file=sys.stderr, flush=True)
            return


def _relative_hostfile(cfg):
    """The config's hostfile relative to the config's directory, when it lies below it (it is
    uploaded beside the config, where the uploaded config's relative `hosts:` finds it); else None."""
    if not cfg.hostfile or not cfg.base_dir:
        return None
    rel = os.path.relpath(cfg.hostfile, cfg.base_dir)
    return None if rel == os.curdir or rel.split(os.sep)[0] == os.pardir else rel
