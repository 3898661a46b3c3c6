"""collbench/signals.py: what each kind of process does on SIGTERM and Ctrl-C, with real signals
sent to this process (handlers run in the main thread, as in the real processes)."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from collbench import signals
from conftest import REPO


def _deliver(sig):
    os.kill(os.getpid(), sig)       # a signal to oneself is handled before the next bytecode


@pytest.mark.parametrize("kind, stops, ignored", [
    (signals.DAEMON, (signal.SIGTERM, signal.SIGINT), (signal.SIGHUP, signal.SIGPIPE)),
    (signals.AGENT, (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE), ()),
    (signals.SERVER, (signal.SIGTERM, signal.SIGINT), ()),
])
def test_each_kind_stops_on_its_signals_ignores_the_others_and_restores_what_was_there(kind, stops, ignored):
    before = {s: signal.getsignal(s) for s in stops + ignored}
    got = []
    with signals.install(kind, lambda signum, frame: got.append(signum)):
        for s in stops:
            _deliver(s)
        for s in ignored:           # ignored: the process lives on, on_stop is not called
            _deliver(s)
            assert signal.getsignal(s) is signal.SIG_IGN
    assert got == list(stops)
    assert {s: signal.getsignal(s) for s in stops + ignored} == before


def test_a_verb_turns_sigterm_into_terminated_and_leaves_ctrl_c_to_python():
    with pytest.raises(signals.Terminated):
        with signals.install(signals.VERB, signals.raise_terminated):
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
            _deliver(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_extra_handlers_sit_beside_the_kind_and_go_with_it():
    got = []
    with signals.install(signals.DAEMON, lambda *a: None, extra={signal.SIGALRM: lambda s, f: got.append(s)}):
        _deliver(signal.SIGALRM)
    assert got == [signal.SIGALRM] and signal.getsignal(signal.SIGALRM) is signal.SIG_DFL


def test_a_writer_killed_inside_dies_of_sigterm_with_its_cleanup_run(tmp_path):
    code = textwrap.dedent(f"""
        import os, signal, time
        from collbench import signals
        with signals.writer_dies_cleanly():
            try:
                open({str(tmp_path / 'temp')!r}, 'w').close()
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            finally:
                os.unlink({str(tmp_path / 'temp')!r})
        print('survived')
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO), timeout=60)
    assert p.returncode == -signal.SIGTERM and "survived" not in p.stdout, p.stderr
    assert not (tmp_path / "temp").exists()


def test_a_writer_under_a_verb_keeps_the_verbs_handler():
    with signals.install(signals.VERB, signals.raise_terminated):
        with signals.writer_dies_cleanly():
            assert signal.getsignal(signal.SIGTERM) is signals.raise_terminated
        assert signal.getsignal(signal.SIGTERM) is signals.raise_terminated
