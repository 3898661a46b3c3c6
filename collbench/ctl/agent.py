"""Run one command on the master for the SSH controller, and never let it outlive the session.

    python -m collbench.ctl.agent [--grace SECONDS] -- COMMAND [ARGS...]

The controller keeps the channel's stdin open while the command runs. When it sends `cancel`
or closes stdin (Ctrl-C on the laptop, the controller killed, the network gone and the session
torn down) the agent stops the command: SIGTERM to its process group and to every process that
descends from it (a job may start its own sessions), then SIGKILL to what is left after the
grace period. Output is relayed through pipes the agent owns, so a daemon the command leaves
behind on purpose (`stress start`) cannot hold the SSH channel open.

Exit status: the command's (128+N when a signal N ended it), 130 when cancelled.
"""

import argparse
import os
import subprocess
import sys
import threading

from collbench import proctree, signals

DRAIN_SECONDS = 1.0


def tree(root):
    """{pid: start ticks} of root and every running process below it."""
    stats = proctree.all_stats()
    pids = proctree.descendants(root, stats) + ([root] if root in stats else [])
    return {pid: stats[pid].start_ticks for pid in pids}


def stop(child, grace):
    """SIGTERM the command's group and tree, SIGKILL what is left after `grace` seconds."""
    procs = {}   # every process seen in the tree, with its start time: signalled only while it is that one

    def live():
        procs.update(tree(child.pid))
        stats = proctree.all_stats()
        return {p: s for p, s in procs.items() if proctree.same_process(p, s, stats)}

    proctree.stop_tree(live, grace, groups=child.pid, on_wait=child.poll, poll=0.1)
    child.wait()


def _relay(src, dst):
    fd = src.fileno()
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            return
        if not data:
            return
        try:
            dst.write(data)
            dst.flush()
        except (OSError, ValueError):
            return


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m collbench.ctl.agent")
    p.add_argument("--grace", type=float, default=10.0, help="SIGTERM -> SIGKILL grace, seconds")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        p.error("no command given")
    cancel = threading.Event()

    signals.install(signals.AGENT, lambda signum, frame: cancel.set())

    env = dict(os.environ, PYTHONUNBUFFERED="1")   # stream progress, do not block-buffer it
    try:
        child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True, env=env)
    except OSError as e:
        print(f"collbench agent: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        return 127
    relays = [threading.Thread(target=_relay, args=(child.stdout, sys.stdout.buffer), daemon=True),
              threading.Thread(target=_relay, args=(child.stderr, sys.stderr.buffer), daemon=True)]
    for t in relays:
        t.start()

    def watch_stdin():
        while True:
            try:
                line = sys.stdin.buffer.readline()
            except (OSError, ValueError):
                line = b""
            if not line or line.strip() == b"cancel":
                cancel.set()
                return
    threading.Thread(target=watch_stdin, daemon=True).start()

    while child.poll() is None and not cancel.is_set():
        cancel.wait(0.1)
    cancelled = child.returncode is None
    if cancelled:
        stop(child, args.grace)
    for t in relays:
        t.join(DRAIN_SECONDS)
    if cancelled:
        try:
            sys.stderr.buffer.write(b"collbench agent: cancelled; the command and its processes were stopped\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        return 130
    rc = child.returncode
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)   # the relay threads may still block on pipes a left-behind daemon holds
