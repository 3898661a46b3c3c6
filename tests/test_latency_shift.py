"""The exporter's online change-point test (collectors/latency_shift.py, change_point.py): a real
`collbench exporter` tails a results log the test appends to; a one-step spike (even 50x) does not
set collbench_latency_shift, a shift that persists does, and the flag clears when the latency comes
back. Then the test itself: its statistic on sequences (spike, short burst, shift, slow drift)."""

import random
import time

from collbench.change_point import DRIFT, H, WARMUP, Z_CAP, ShiftDetector
from conftest import wait_for
from exporter_helpers import ExporterProcess, append, result_line, sample

OP, SIZE = "allreduce", "4MB"


def _scrape_after(ex, seq):
    """The metrics once the exporter has read record `seq`."""
    def read():
        m = ex.metrics()
        n = sample(m, "collbench_results_records_total", type="result")
        return m if n is not None and n >= seq else None
    m = wait_for(read, 30, interval=0.1)
    assert m is not None, "the exporter did not read the appended records"
    return m


class _Log:
    """A results log the test appends result lines of OP to, numbered in order."""

    def __init__(self, path):
        self.path, self.seq = path, 0
        path.write_text("")

    def add(self, values):
        text = ""
        for v in values:
            self.seq += 1
            text += result_line(self.seq, op=OP, avg_us=v, ts=time.time())
        append(self.path, text)


def test_exporter_flags_a_persistent_shift_and_not_a_spike(tmp_path, free_port):
    log = _Log(tmp_path / "results.jsonl")
    rng = random.Random(5)
    with ExporterProcess(["--results-log", str(log.path), "--state-dir", str(tmp_path), "--poll-interval", "0.1",
                          "--collectors", "results,congestion_top,latency_shift"], free_port) as ex:
        ex.wait_ready(timeout=60)
        log.add([100 * rng.gauss(1, 0.02) for _ in range(WARMUP + 8)])
        m = _scrape_after(ex, log.seq)
        assert sample(m, "collbench_latency_shift", op=OP, size=SIZE) == 0
        assert sample(m, "collbench_latency_shift_threshold") == H
        assert 95 < sample(m, "collbench_latency_shift_reference_seconds", op=OP, size=SIZE) * 1e6 < 105
        log.add([5000.0] + [100 * rng.gauss(1, 0.02) for _ in range(3)])      # a 50x spike: one step
        m = _scrape_after(ex, log.seq)
        assert sample(m, "collbench_latency_shift", op=OP, size=SIZE) == 0
        assert sample(m, "collbench_latency_shift_cusum", op=OP, size=SIZE) < H
        log.add([160 * rng.gauss(1, 0.02) for _ in range(6)])                  # 1.6x, and it stays
        m = _scrape_after(ex, log.seq)
        assert sample(m, "collbench_latency_shift", op=OP, size=SIZE) == 1
        assert sample(m, "collbench_latency_shift_cusum", op=OP, size=SIZE) > H
        log.add([100 * rng.gauss(1, 0.02) for _ in range(25)])                 # back to normal: it clears
        m = _scrape_after(ex, log.seq)
        assert sample(m, "collbench_latency_shift", op=OP, size=SIZE) == 0
        assert sample(m, "collbench_collector_success", collector="latency_shift") == 1


def _run(values):
    d = ShiftDetector()
    fired = []
    for v in values:
        d.add(v)
        fired.append(d.shift)
    return d, fired


def test_one_spike_or_a_three_step_burst_never_fires_four_steps_do():
    base = [100.0 + (i % 3) for i in range(WARMUP)]
    for burst in (1, 2, 3):
        _, fired = _run(base + [1e6] * burst + [100.0] * 30)
        assert not any(fired), burst
    d, fired = _run(base + [1e6] * 4)
    assert fired[-1] and not any(fired[:-1])
    # each capped step adds Z_CAP - DRIFT: the arithmetic the docs promise
    assert d.statistic == 4 * (Z_CAP - DRIFT) > H >= 3 * (Z_CAP - DRIFT)


def test_a_shift_fires_and_clears_a_slow_drift_and_noise_do_not():
    rng = random.Random(7)
    noise = [100 * rng.gauss(1, 0.03) for _ in range(2000)]
    assert not any(_run(noise)[1])
    drift = [100 * (1 + i / 4000) * rng.gauss(1, 0.01) for i in range(2000)]   # +50 % over 2000 steps
    assert not any(_run(drift)[1])
    shifted = noise[:100] + [x * 1.3 for x in noise[100:130]] + noise[130:200]
    d, fired = _run(shifted)
    assert any(fired[100:110]) and not any(fired[:100]) and not fired[-1]


def test_a_series_without_results_for_max_age_is_not_exported():
    """A stopped stress loop must not hold collbench_latency_shift (and the alert) at 1 forever."""
    from types import SimpleNamespace
    from collbench.exporter.collectors.latency_shift import LatencyShiftCollector
    from collbench.exporter.results_state import ResultsState
    now = [1000.0]
    state = ResultsState(max_age=60.0, clock=lambda: now[0])
    col = LatencyShiftCollector(state, clock=lambda: now[0])
    assert state.observers == [col.observe]
    for i in range(WARMUP + 6):
        col.observe(SimpleNamespace(key=("allreduce", 4 << 20, 2, 4), op="allreduce", size="4MB",
                                    avg_s=1e-4 * (2 if i >= WARMUP else 1), ts=now[0]))

    def shift_samples():
        return [(s.labels, s.value) for fam in col.collect() if fam.name == "collbench_latency_shift"
                for s in fam.samples]
    assert shift_samples() == [({"op": "allreduce", "size": "4MB"}, 1.0)]
    now[0] += 61
    assert shift_samples() == []


def test_a_lasting_change_below_the_ratio_is_no_shift_and_the_reference_follows_it():
    rng = random.Random(11)
    level = [100 * rng.gauss(1, 0.02) for _ in range(60)]
    higher = [110 * rng.gauss(1, 0.02) for _ in range(200)]        # +10 %: a machine's load, not a fault
    d, fired = _run(level + higher)
    assert not any(fired)
    assert d.statistic < H / 2 and 105 < d.median < 115, (d.statistic, d.median)   # followed, back in control
    before = d.median
    for _ in range(10):                                              # +30 % on the new level: a shift
        d.add(1.3 * before * rng.gauss(1, 0.02))
    assert d.shift and 1.2 < d.ratio < 1.4, d.ratio


def test_min_ratio_sets_how_big_a_shift_must_be():
    rng = random.Random(3)
    level = [100 * rng.gauss(1, 0.02) for _ in range(40)]
    for factor, ratio, fires in ((1.3, 1.2, True), (1.3, 1.5, False), (1.8, 1.5, True)):
        d = ShiftDetector(min_ratio=ratio)
        fired = []
        for x in level + [factor * 100 * rng.gauss(1, 0.02) for _ in range(30)]:
            d.add(x)
            fired.append(d.shift)
        assert any(fired) == fires, (factor, ratio)
        assert abs(d.ratio - factor) < 0.1 or not fires


def test_exporter_takes_the_ratio_from_alerts_shift_ratio(tmp_path, free_port):
    log = _Log(tmp_path / "results.jsonl")
    cfg = tmp_path / "collbench.yaml"
    cfg.write_text("alerts:\n  shift_ratio: 1.5\n")
    rng = random.Random(9)
    with ExporterProcess(["--config", str(cfg), "--results-log", str(log.path), "--state-dir", str(tmp_path),
                          "--poll-interval", "0.1", "--collectors", "results,latency_shift"], free_port) as ex:
        ex.wait_ready(timeout=60)
        log.add([100 * rng.gauss(1, 0.02) for _ in range(WARMUP + 8)])
        m = _scrape_after(ex, log.seq)
        assert sample(m, "collbench_latency_shift_min_ratio") == 1.5
        log.add([130 * rng.gauss(1, 0.02) for _ in range(6)])                  # 1.3x: under this config's 1.5
        m = _scrape_after(ex, log.seq)
        assert sample(m, "collbench_latency_shift", op=OP, size=SIZE) == 0
        assert 1.2 < sample(m, "collbench_latency_shift_ratio", op=OP, size=SIZE) < 1.4
        log.add([200 * rng.gauss(1, 0.02) for _ in range(6)])                  # 2x: a shift
        m = _scrape_after(ex, log.seq)
        assert sample(m, "collbench_latency_shift", op=OP, size=SIZE) == 1
        assert sample(m, "collbench_latency_shift_ratio", op=OP, size=SIZE) > 1.5


def test_a_shifted_rank_count_wins_over_a_larger_statistic_without_a_shift():
    """Two rank counts of one op and size, exported as one series: 8 ranks wander up 15 % (its
    statistic at the cap, no shift), 4 ranks shift 2x (a smaller statistic so far): the flag is on."""
    from types import SimpleNamespace
    from collbench.exporter.collectors.latency_shift import LatencyShiftCollector
    col = LatencyShiftCollector()
    rng = random.Random(4)

    def feed(ranks, values):
        for v in values:
            col.observe(SimpleNamespace(key=("allreduce", 4 << 20, 2, ranks), op="allreduce", size="4MB",
                                        avg_s=v * 1e-6, ts=time.time()))
    feed(8, [100 * rng.gauss(1, 0.01) for _ in range(WARMUP)] + [115.0] * 7)
    feed(4, [100 * rng.gauss(1, 0.01) for _ in range(WARMUP)] + [200.0] * 4)
    fams = {fam.name: fam.samples for fam in col.collect()}
    assert [s.value for s in fams["collbench_latency_shift_cusum"]] == [12.0]      # 4 x (4 - 1): the 4-rank one
    assert [s.value for s in fams["collbench_latency_shift"]] == [1.0]
