"""collbench.harness: the one run context of the verbs that run MPI jobs. A real SIGTERM and a
real Ctrl-C inside the block, a real launcher-like child left behind, the time left."""

import io
import os
import signal
import subprocess
import sys
import time

import pytest

from collbench import harness, proctree


def _alive(pid):
    return proctree.pid_alive(pid)


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_a_signal_inside_the_block_stops_leftovers_and_sets_the_exit_code(sig, code, word):
    err = io.StringIO()
    before = signal.getsignal(signal.SIGTERM)
    # a launcher that leads its own process group, as mpirun does, that nothing holds any more
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    progress = harness.Progress(err, 4)
    with harness.Run("sweep", progress=progress, unit="steps", on_stop="no file written", stream=err) as run:
        progress.finished("allreduce 1KB")
        os.kill(os.getpid(), sig)
        time.sleep(5)
        pytest.fail("the signal did not unwind the block")
    assert run.stopped and run.exit_code == code
    assert child.wait(timeout=15) is not None and not _alive(child.pid)
    assert err.getvalue().splitlines()[-1] == f"collbench sweep: {word} after 1 of 4 steps; no file written"
    assert signal.getsignal(signal.SIGTERM) is before


def test_other_errors_pass_through_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ValueError):
        with harness.Run("once", progress=harness.Progress(io.StringIO(), 1)):
            assert signal.getsignal(signal.SIGTERM) is harness.raise_terminated
            raise ValueError("not ours")
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_verb_stopped_by_sigterm_from_outside_exits_143():
    """The whole path in a real process: SIGTERM from another process, exit 143, the message."""
    code = ("import sys, time\nfrom collbench import harness\n"
            "with harness.Run('once', progress=harness.Progress(sys.stderr, 2), on_stop='no result file written') as r:\n"
            "    print('ready', flush=True)\n    time.sleep(60)\nsys.exit(r.exit_code)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143
    assert "collbench once: terminated after 0 of 2 steps; no result file written" in err


def test_time_left_scales_the_time_so_far_by_the_weight_still_to_run(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(harness.progress.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    p = harness.Progress(out, 3, weights=[1, 1, 2])
    assert p.seconds_left() is None                    # nothing finished: no estimate
    now[0] += 10
    p.finished("a")
    assert p.seconds_left() == pytest.approx(30)       # 10 s for weight 1, weight 3 to go
    now[0] += 10
    p.finished("b")
    assert p.seconds_left() == pytest.approx(20)
    now[0] += 20
    p.finished("c")
    assert p.seconds_left() is None
    assert out.getvalue().splitlines() == ["[1/3] a; ~30s left", "[2/3] b; ~20s left", "[3/3] c"]


def test_quiet_counts_but_prints_nothing_and_durations_read_as_a_countdown():
    out = io.StringIO()
    p = harness.Progress(out, 2, quiet=True)
    p.finished("x")
    assert p.done == 1 and out.getvalue() == ""
    from collbench.tables import format_duration
    assert [format_duration(s, days=False) for s in (0.4, 45, 725, 3725, 90000)] == ["0s", "45s", "12m05s", "1h02m",
                                                                                    "25h00m"]
    # the time left of a progress line reads as that countdown
    p = harness.Progress(out, 3)
    p.started = time.monotonic() - 90000
    p.finished("x")
    assert "~50h00m left" in out.getvalue(), out.getvalue()


def test_tally_counts_failed_invalid_and_never_run():
    from collbench.config import Step
    steps = [Step("allreduce", 1024, 1, 1, "float"), Step("allreduce", 2048, 1, 1, "float"),
             Step("bcast", 1024, 1, 1, "char")]
    recs = [{"type": "result", "op": "allreduce", "size_bytes": 1024, "validation": "fail"},
            {"type": "failure", "op": "allreduce", "size_bytes": 2048, "error": "x"}]
    t = harness.tally(recs, steps)
    assert (len(t.failed), len(t.bad_validation), len(t.not_run), t.exit_code) == (1, 1, 1, 1)
    assert t.message() == "1 failed, 1 failed validation, 1 not run, of 3 steps"
    assert harness.tally([{"type": "result", "op": "bcast", "size_bytes": 1024}], steps[2:]).exit_code == 0
