"""`collbench locate`'s search on a simulated fabric (host, link, none; probe counts against the
full matrix; one-sided noise names nothing), its refusal while a real stress daemon holds the
hosts, and bad input. The testbed cases (a shaped host named, an unshaped testbed clean, SIGTERM)
are tests/test_locate_testbed.py."""

import random
import subprocess
import sys

import pytest

from collbench.locate.search import judge_pairs, locate
from collbench.locate.simulate import SimulatedFabric, full_matrix_pairs, simulate, simulate_probes
from conftest import REPO


def _named(res):
    c = res.culprit
    return None if c is None else c.get("host") or tuple(c["link"])


@pytest.mark.parametrize("p", [3, 4, 5, 8, 13, 64, 1024])
def test_every_host_found_in_far_fewer_probes_than_the_matrix(p):
    for culprit in sorted({"h0", f"h{p // 2}", f"h{p - 1}"}):
        res = simulate(p, culprit)
        assert _named(res) == culprit, (p, culprit, res.verdict)
        assert res.culprit["evidence"]["slowest_of_its_pairs_vs_others"] >= 2
    assert simulate(p, None).culprit is None
    if p >= 8:
        assert simulate_probes(p, "h1") < full_matrix_pairs(p)
    if p >= 64:
        assert simulate_probes(p, "h1") < full_matrix_pairs(p) / 20
    assert simulate_probes(1024, "h7") <= 60


def test_a_link_inside_a_half_is_named_as_a_link():
    res = simulate(16, ("h8", "h9"))
    assert _named(res) == ("h8", "h9"), res.verdict
    assert res.culprit["evidence"]["pair_vs_other_pairs"] >= 2


class NoisyFabric(SimulatedFabric):
    """Contention as the testbed shows it: during each probe job one random host is busy and
    everything it takes part in is slower by a random factor up to `noise` (only ever slower)."""

    def __init__(self, p, culprit, noise, seed):
        super().__init__(p, culprit)
        self.rng = random.Random(seed)
        self.noise = noise

    def _busy(self):
        return self.rng.choice(self.hosts), self.rng.uniform(1.0, self.noise)

    def group(self, hosts):
        busy, f = self._busy()
        return super().group(hosts) * (f if busy in hosts else 1.0)

    def pairs(self, hosts):
        busy, f = self._busy()
        return {k: v * (f if busy in k else 1.0) for k, v in super().pairs(hosts).items()}


def test_one_sided_noise_names_nothing_and_still_finds_the_culprit():
    wrong = 0
    for seed in range(200):
        res = locate(*(lambda f: (f.hosts, f))(NoisyFabric(8, None, 4.0, seed)), clock=lambda: 0.0)
        wrong += res.culprit is not None
        f = NoisyFabric(8, "h5", 4.0, seed)
        assert _named(locate(f.hosts, f, clock=lambda: 0.0)) == "h5", seed
    # noise up to 4x against a 2x ratio: the confirmation (each probe's faster run) keeps
    # false culprits rare (a busy host slows all its pairs in one run, rarely in two); without it
    # they are common
    unconfirmed = sum(locate(*(lambda f: (f.hosts, f))(NoisyFabric(8, None, 4.0, s)), confirm=False,
                             clock=lambda: 0.0).culprit is not None for s in range(200))
    assert wrong * 10 < unconfirmed, (wrong, unconfirmed)


def test_judge_pairs_needs_a_host_slow_with_every_peer():
    costs = {("a", "b"): 10.0, ("a", "c"): 1.0, ("b", "c"): 1.1, ("a", "d"): 1.0, ("b", "d"): 1.2, ("c", "d"): 0.9}
    culprit, verdict = judge_pairs(["a", "b", "c", "d"], costs, 2.0)
    assert culprit["link"] == ["a", "b"] and "link a-b" in verdict
    culprit, verdict = judge_pairs(["a", "b", "c", "d"], {k: 1.0 for k in costs}, 2.0)
    assert culprit is None and "beyond the noise" in verdict


def _locate(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "collbench", "locate", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_refuses_while_the_stress_daemon_holds_the_hosts(tmp_path):
    cfg = tmp_path / "c.yaml"
    # hosts nobody answers on: the daemon runs (its jobs fail and back off), locate must not
    cfg.write_text(f"hosts: [127.0.0.2, 127.0.0.3, 127.0.0.4]\nstate_dir: {tmp_path / 'state'}\n"
                   "stress:\n  backoff_initial: 600\n")
    r = subprocess.run([sys.executable, "-m", "collbench", "stress", "start", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    try:
        r = _locate("--config", str(cfg))
        assert r.returncode == 2 and "the stress daemon" in r.stderr and "--force" in r.stderr, r.stderr
        assert "127.0.0.3" in r.stderr and not r.stdout
    finally:
        stop = subprocess.run([sys.executable, "-m", "collbench", "stress", "stop", "--config", str(cfg)],
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        assert stop.returncode == 0, stop.stderr
    # the daemon gone: no refusal (the probes then fail on the unreachable hosts: exit 1, not 2)
    r = _locate("--config", str(cfg), "--format", "json", timeout=120)
    assert "the stress daemon" not in r.stderr and r.returncode == 1, r.stderr


def test_bad_input_exit_2(tmp_path):
    two = tmp_path / "two.yaml"
    two.write_text("hosts: [a, b]\n")
    r = _locate("--config", str(two))
    assert r.returncode == 2 and "at least 3 configured hosts" in r.stderr
    three = tmp_path / "three.yaml"
    three.write_text("hosts: [a, b, c]\n")
    for args, what in ((["--ratio", "1"], "--ratio"), (["--op", "nosuchop"], "nosuchop"), (["--size", "-1"], "--size"),
                       (["--format", "xml"], "--format")):
        r = _locate("--config", str(three), *args)
        assert r.returncode == 2 and what in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_csv_rows_one_per_measurement():
    from collbench.locate.cli import CSV_COLUMNS, csv_rows
    from collbench.tables import csv_text
    doc = dict(simulate(8, "h3").to_dict(), hosts=[f"h{i}" for i in range(8)])
    lines = csv_text(CSV_COLUMNS, csv_rows(doc)).splitlines()
    assert lines[0] == "probe,kind,hosts,a,b,value_us,failed"
    assert len(lines) - 1 == doc["measurements"] == 20
    assert lines[1] == "1,group,h0 h1 h2 h3,,,10," and lines[-1] == "10,pairs,h2 h3 h0 h1,h3,h1,10,"
