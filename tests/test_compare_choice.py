"""The tuning file's choice logic on fake block samples: a rule only for a proven win.

The fakes are block samples drawn from a log-normal job-to-job noise (15 %, the spread the issue
measured on a quiet 2-core machine), each a seeded draw; no MPI runs here (test_compare_proof.py
runs the real thing)."""

import math
import random
import statistics

import pytest

from collbench.compare import check, rules_file, stats, table
from collbench.compare.blocks import Policy, undecided
from collbench.engines import mpi_flavour

ALGS = ("ring", "bruck", "recursive_doubling", "neighbor", "linear")
SIZES = (1024, 16384, 262144)


def fake_rows(rng, blocks, true=None, sigma=0.15, algs=ALGS, sizes=SIZES, op="allgather"):
    """Rows as compare's median_rows makes them; true: {(algorithm, size): real speed-up}."""
    rows = []
    for size in sizes:
        for a in ("default",) + tuple(algs):
            base = 50.0 + size / 1000.0
            f = (true or {}).get((a, size), 1.0)
            samples = [base / f * rng.lognormvariate(0.0, sigma) for _ in range(blocks)]
            r = table.make_row(op, a, size, size, "char", table.OK,
                               {"latency_avg_us": statistics.median(samples), "validation": "pass"})
            r["samples_us"], r["blocks"] = samples, blocks
            rows.append(r)
    return rows


def forced(rows):
    return {(r["size_bytes"], r["algorithm"]) for r in rows if r["chosen"] and r["algorithm"] != "default"}


@pytest.mark.parametrize("blocks", [1, 2, 3, 4])
def test_a_few_noisy_blocks_never_yield_a_rule(blocks):
    """Noise only (every algorithm as fast as default), up to 4 blocks: no interval can reach 95 %
    with 5 tries per size, so no seed can force anything (the old single-measurement choice forced
    the luckiest algorithm at every size)."""
    for seed in range(300):
        rows = table.annotate(fake_rows(random.Random(seed), blocks))
        assert forced(rows) == set(), seed
        assert all(r["chosen"] for r in rows if r["algorithm"] == "default")
        # the lowest median is still marked, as information: it is noise here
        assert sum(r["fastest"] for r in rows) == len(SIZES)


def test_noise_proves_a_win_at_most_as_often_as_promised():
    """With more blocks a noise-only fake may look like a win by chance: at most 2.5 % of sizes
    (one side of the 95 % family of intervals at a size), and the margin makes it rarer still."""
    sizes_tried = wins = 0
    for seed in range(400):
        blocks = (5, 6, 8, 12, 20)[seed % 5]
        rows = table.annotate(fake_rows(random.Random(1000 + seed), blocks))
        sizes_tried += len(SIZES)
        wins += len({s for s, _ in forced(rows)})
    assert wins / sizes_tried <= 0.025, (wins, sizes_tried)


def test_noise_then_the_check_leaves_no_rule():
    """The whole chain on noise: a chance 'win' that survives the choice meets the check's fresh
    samples; whatever the file still forces is never slower beyond the check's noise."""
    for seed in range(200):
        rng = random.Random(5000 + seed)
        rows = table.annotate(fake_rows(rng, 12))
        f = {("allgather", s): a for s, a in forced(rows)}
        results = {}
        for size in SIZES:
            without = [100 * rng.lognormvariate(0, 0.15) for _ in range(8)]
            with_file = [100 * rng.lognormvariate(0, 0.15) for _ in range(8)]
            results[("allgather", size)] = stats.speedup_interval(without, with_file)
        verdicts, noise = check.judge(results, f)
        floor = 1 - (noise or 0)
        for v in verdicts:
            if v.verdict == "kept":
                assert v.gain >= floor and v.ci_high >= 1


def test_a_real_win_is_proven_and_chosen():
    """The control of the tests above: a 30 % win at one size under the same noise is found."""
    rows = table.annotate(fake_rows(random.Random(7), 12, true={("ring", 16384): 1.3}))
    assert forced(rows) == {(16384, "ring")}
    ring = next(r for r in rows if r["algorithm"] == "ring" and r["size_bytes"] == 16384)
    assert ring["win"] and ring["ci_low"] > 1.05 and ring["ci_low"] <= ring["speedup"] <= ring["ci_high"]
    # a smaller win than the margin is not forced, whatever the blocks
    rows = table.annotate(fake_rows(random.Random(7), 40, true={("ring", 16384): 1.03}, sigma=0.01))
    assert forced(rows) == set()
    ring = next(r for r in rows if r["algorithm"] == "ring" and r["size_bytes"] == 16384)
    assert ring["win"] and not ring["chosen"]          # faster beyond noise, below the margin
    rows = table.annotate(fake_rows(random.Random(7), 40, true={("ring", 16384): 1.03}, sigma=0.01), margin=0.01)
    assert forced(rows) == {(16384, "ring")}


def test_the_interval_is_the_exact_rank_interval():
    # m = n = 10 at 95 %: the 24th smallest and largest of the 100 ratios (U's critical value 23)
    assert stats.rank_cut(10, 10, 0.025) == 24
    assert stats.rank_cut(5, 5, 0.025) == 3 and stats.rank_cut(4, 4, 0.025) == 1
    assert stats.rank_cut(3, 3, 0.025) is None
    base = [float(x) for x in range(100, 110)]
    cand = [x / 2 for x in base]
    s, lo, hi = stats.speedup_interval(base, cand)
    ratios = sorted(b / c for b in base for c in cand)
    assert s == pytest.approx(2.0)
    assert (lo, hi) == (pytest.approx(ratios[23]), pytest.approx(ratios[-24]))
    assert stats.speedup_interval(base[:3], cand[:3])[1:] == (None, None)
    assert stats.speedup_interval([], cand) == (None, None, None)
    assert stats.speedup_interval([float("nan"), -1.0], cand) == (None, None, None)


def test_neighbouring_sizes_merge_only_when_proven_at_both():
    true = {("ring", 1024): 1.5, ("ring", 4096): 1.5, ("ring", 65536): 1.5}
    sizes = (1024, 4096, 16384, 65536)
    rows = table.annotate(fake_rows(random.Random(3), 12, true=true, sigma=0.05, sizes=sizes))
    assert forced(rows) == {(1024, "ring"), (4096, "ring"), (65536, "ring")}
    choices = [rules_file.Choice(size, r["algorithm"], "4" if r["algorithm"] == "ring" else "0")
               for size in sizes for r in rows if r["size_bytes"] == size and r["chosen"]]
    rules = rules_file.ompi_rules_for_op("allgather", choices, 4)
    # 1KB and 4KB merge into one ring rule; 16KB (not proven) breaks the run: the library's choice
    assert [(value, name) for _, value, name, _ in rules] == [("4", "ring"), ("0", "default"), ("4", "ring")]


def test_mpich_forces_one_algorithm_only_if_never_slower():
    sizes = (1024, 16384)
    # ring proven at 1KB, 30 % slower at 16KB: forcing it for every size would slow 16KB
    rows = table.annotate(fake_rows(random.Random(4), 12, true={("ring", 1024): 1.5, ("ring", 16384): 0.7},
                                    sigma=0.05, sizes=sizes, algs=("ring",)), flavour=mpi_flavour.MPICH)
    assert forced(rows) == set()
    rows = table.annotate(fake_rows(random.Random(4), 12, true={("ring", 1024): 1.5, ("ring", 16384): 1.0},
                                    sigma=0.02, sizes=sizes, algs=("ring",)), flavour=mpi_flavour.MPICH)
    assert forced(rows) == {(1024, "ring"), (16384, "ring")}


def test_check_drops_a_size_slower_beyond_noise():
    results = {("allgather", 1024): (0.80, 0.70, 0.90),     # forced, slower beyond noise
               ("allgather", 4096): (1.20, 1.10, 1.30),     # forced, faster
               ("allgather", 8192): (0.97, 0.90, 1.05),     # forced, slower than the control allows
               ("allgather", 16384): (1.01, 0.95, 1.08),    # control: noise 1 %
               ("allgather", 32768): (None, None, None)}    # forced, the file's job failed
    f = {("allgather", s): "ring" for s in (1024, 4096, 8192, 32768)}
    verdicts, noise = check.judge(results, f)
    got = {v.size_bytes: v.verdict for v in verdicts}
    assert got == {1024: "dropped", 4096: "kept", 8192: "dropped", 16384: "control", 32768: "dropped"}
    assert noise == pytest.approx(0.01)
    # a wider control forgives 0.97 (not beyond noise), never an interval wholly below 1
    results[("allgather", 16384)] = (1.04, 0.95, 1.10)
    got = {v.size_bytes: v.verdict for v in check.judge(results, f)[0]}
    assert got[8192] == "kept" and got[1024] == "dropped"
    assert [k for k in check.abba(3)] == ["default", "rules", "rules", "default", "default", "rules"]


def test_adaptive_blocks_stop_when_settled():
    policy = Policy(margin=0.05, width=0.10)
    wide = table.annotate(fake_rows(random.Random(9), 6, sigma=0.3))
    assert undecided(wide, policy)
    narrow = table.annotate(fake_rows(random.Random(9), 30, sigma=0.005))
    assert undecided(narrow, policy) == []
    clear = table.annotate(fake_rows(random.Random(9), 8, true={(a, s): 2.0 for a in ALGS for s in SIZES},
                                     sigma=0.05))
    assert undecided(clear, policy) == [] and len(forced(clear)) == len(SIZES)
    assert math.isfinite(stats.geometric_mean([1.1, 0.9]))
