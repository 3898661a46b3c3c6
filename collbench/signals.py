"""What each kind of collbench process does on SIGTERM and Ctrl-C, and the one place their signal
handlers are installed.

    kind      who                       SIGTERM                       Ctrl-C (SIGINT)   also
    VERB      a verb running MPI work   raises Terminated: unwinds    KeyboardInterrupt -
              (harness.Run)             like Ctrl-C, the job stopped, (Python's), 130
                                        exit 143
    DAEMON    the stress daemon         on_stop: finish, stop the     on_stop           SIGHUP, SIGPIPE ignored: a
                                        job (SIGKILL after its grace,                   closing SSH session is no stop
                                        a SIGALRM handler beside)
    AGENT     the ctl agent on the      on_stop: stop the command's   on_stop           SIGHUP, SIGPIPE: on_stop (the
              master                    whole process tree                              controller's session is gone)
    SERVER    a long-running server     on_stop: shut the server      on_stop           -
              (the exporter)            down from another thread
                                        (serve_forever's own thread
                                        would wait on itself)
    WRITER    an atomic file writer     while its temporary file      Python's          -
              (atomic_file)             exists, and only where
                                        SIGTERM is still the default:
                                        raises, the temp is removed,
                                        then dies of SIGTERM as it
                                        would have

A handler runs in the main thread between two bytecodes: the DAEMON, AGENT and SERVER ones only
set flags, write to a wake-up pipe or start a thread; the VERB and WRITER ones raise, so the code
they interrupt unwinds through its own cleanup.
"""

import contextlib
import os
import signal
import threading
from typing import NamedTuple


class Kind(NamedTuple):
    """A kind of process: the signals its on_stop handles and the ones it ignores."""
    name: str
    stop: tuple
    ignored: tuple = ()


VERB = Kind("verb", (signal.SIGTERM,))          # SIGINT stays Python's KeyboardInterrupt
DAEMON = Kind("daemon", (signal.SIGTERM, signal.SIGINT), (signal.SIGHUP, signal.SIGPIPE))
AGENT = Kind("agent", (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE))
SERVER = Kind("server", (signal.SIGTERM, signal.SIGINT))


class Terminated(Exception):
    """SIGTERM arrived: unwind like Ctrl-C so the running MPI job is stopped, not orphaned."""


def raise_terminated(signum, frame):
    raise Terminated()


class Handlers:
    """The handlers of one kind, installed; restore() (or leaving the `with` block) puts back what
    was there before. Main thread only, as Python's signal module requires."""

    def __init__(self, kind, on_stop, extra=None):
        self.kind = kind
        wanted = {s: on_stop for s in kind.stop}
        wanted.update({s: signal.SIG_IGN for s in kind.ignored})
        wanted.update(extra or {})
        self._previous = {s: signal.signal(s, handler) for s, handler in wanted.items()}

    def restore(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()
        return False


def install(kind, on_stop, extra=None):
    """Install kind's handlers: on_stop(signum, frame) for its stop signals, SIG_IGN for the ones
    it ignores, extra {signum: handler} beside (the daemon's SIGALRM); the Handlers."""
    return Handlers(kind, on_stop, extra)


@contextlib.contextmanager
def writer_dies_cleanly():
    """The WRITER kind, around the life of a temporary file: a SIGTERM with the default action
    (which would kill the process and leave the temp behind) raises Terminated instead; the
    caller's cleanup runs, then the process dies of SIGTERM as it would have. Where SIGTERM
    already has a handler (a VERB or a DAEMON), or off the main thread, nothing changes."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    handlers = install(Kind("writer", (signal.SIGTERM,)), raise_terminated)
    try:
        yield
    except Terminated:
        handlers.restore()
        os.kill(os.getpid(), signal.SIGTERM)
        raise SystemExit(143)  # not reached: the signal kills the process
    finally:
        if signal.getsignal(signal.SIGTERM) is raise_terminated:
            handlers.restore()
