"""A production job seen through the NCCL Inspector, end to end without a GPU (issue 29 item 4).

On a 4-host namespace testbed (one rank per host, ob1 over TCP, cubic pinned in every namespace:
bbr ignores CE), a real MPI job (a C program: MPI_Allreduce of 1 MB in a loop, each rank timing
every call) runs for ~20 s; the stand-in writer (lab/inspector_writer.py: the plugin's writer,
checked against the published samples in test_inspector_import.py) turns each rank's timings into
Inspector lines in that host's dump directory as the job runs (dumped every 0.5 s, the log
truncated on its first dump). Half-way, h2's egress is congested for real: a tbf queue at 200 Mbit/s
and an nftables rule CE-marking its ECN-capable packets past 256 kbytes/s. Every host runs the
counters exporter (`exporter --counters-only --inspector-dir`: netstat counters and its own
Inspector directory), scraped by a real Prometheus every second. `diagnose --inspector DIR
--prometheus URL` names h2's outgoing path from its real TCPDeliveredCE in the slow minutes.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest
import yaml

from conftest import REPO, namespace_testbed, stop_process, wait_for
from lab import testbed
from lab.inspector_writer import InspectorWriter
from prometheus_helpers import Prometheus

pytestmark = [pytest.mark.netns, pytest.mark.mpi, pytest.mark.slow, pytest.mark.alone]

QUIET_S, CONGESTED_S = 10.0, 10.0
SIZE = 1 << 20
PORT = 9106
PROGRAM = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
/* argv: bytes seconds. Prints one line per call and rank: CBI rank host sn start_us exec_us. */
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n, len, go = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long bytes = atol(argv[1]);
    double until = MPI_Wtime() + atof(argv[2]);
    int count = (int)(bytes / 4);
    float *a = malloc(bytes), *b = malloc(bytes);
    for (int i = 0; i < count; i++) a[i] = 1.0f;
    char name[MPI_MAX_PROCESSOR_NAME];
    MPI_Get_processor_name(name, &len);
    for (long sn = 1; go; sn++) {
        struct timeval tv;
        gettimeofday(&tv, NULL);
        double t0 = MPI_Wtime();
        MPI_Allreduce(a, b, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        long us = (long)((MPI_Wtime() - t0) * 1e6);
        printf("CBI %d %s %ld %ld %ld\n", rank, name, sn, tv.tv_sec * 1000000L + tv.tv_usec, us);
        fflush(stdout);
        if (sn % 4 == 0) {
            if (rank == 0) go = MPI_Wtime() < until;
            MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
        }
    }
    MPI_Finalize();
    return 0;
}
"""


def ns(host, *cmd, **kw):
    return subprocess.run(["ip", "netns", "exec", host["netns"], *cmd], **kw)


class StandIn:
    """The Inspector plugin of every rank: each rank's calls (the program's CBI lines) recorded
    and dumped every 0.5 s into its host's directory, as the plugin's dump thread does."""

    def __init__(self, root, hosts):
        self.root, self.writers, self.lines, self.last_dump = root, {}, 0, time.monotonic()
        # --map-by node over the hostfile: rank r on host r (rank 0's processor name is not its
        # namespace's: mpirun starts it with `ip netns exec`, which keeps this machine's UTS name)
        self.names = [h["name"] for h in hosts]

    def feed(self, line):
        m = re.fullmatch(r"CBI (\d+) (\S+) (\d+) (\d+) (\d+)", line.strip())
        if not m:
            return
        rank, sn, start, us = int(m.group(1)), int(m.group(3)), int(m.group(4)), int(m.group(5))
        host = self.names[rank]
        w = self.writers.get(rank)
        if w is None:
            os.makedirs(os.path.join(self.root, host), exist_ok=True)
            w = self.writers[rank] = InspectorWriter(os.path.join(self.root, host), host, 4000 + rank, shape="2.30")
        w.record(comm_id="0x3c0ffee0c0ffee", comm_name="world", rank=rank, n_ranks=4, nnodes=4, func="AllReduce",
                 sn=sn, msg_bytes=SIZE, exec_us=us, timing_source="kernel_gpu",
                 trace=dict(start_sn=1, stop_sn=2, start_ts=start, stop_ts=start + us,
                            kernels=[(3, 5, 4, start, start + us, start + us)]))
        self.lines += 1
        if time.monotonic() - self.last_dump >= 0.5:
            self.dump()

    def dump(self):
        for w in self.writers.values():
            w.dump()
        self.last_dump = time.monotonic()


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspector-testbed")
    with namespace_testbed(4, root / "tb") as desc:
        desc["root"] = str(root)
        yield desc


def test_diagnose_inspector_with_prometheus_names_the_congested_host(bed, tmp_path, free_port):
    mpicc = shutil.which("mpicc")
    assert mpicc, "mpicc (Open MPI) is needed"
    hosts = bed["hosts"]
    h2 = hosts[1]
    for h in hosts:     # marks slow TCP only under an ECN-reactive congestion control
        ns(h, "sysctl", "-q", "-w", "net.ipv4.tcp_congestion_control=cubic", check=True)
    src, prog = tmp_path / "allreduce_loop.c", tmp_path / "allreduce_loop"
    src.write_text(PROGRAM)
    subprocess.run([mpicc, "-O2", "-o", str(prog), str(src)], check=True)
    dump_root = tmp_path / "nccl-inspector-5151"
    dump_root.mkdir()
    for h in hosts:
        (dump_root / h["name"]).mkdir()

    exporters, prom, mpirun = [], None, None
    try:
        for h in hosts:
            exporters.append(subprocess.Popen(
                ["ip", "netns", "exec", h["netns"], sys.executable, "-m", "collbench", "exporter", "--counters-only",
                 "--collectors", "netstat", "--listen", f"{h['addr']}:{PORT}",
                 "--inspector-dir", str(dump_root / h["name"])],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"exporter-{h['alias']}.log", "wb"),
                start_new_session=True))
        prom = Prometheus(tmp_path, {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "collbench-counters", "static_configs": [
                {"targets": [f"{h['addr']}:{PORT}"], "labels": {"host": h["name"]}} for h in hosts]}]}, free_port)
        prom_url = prom.url

        def all_up():
            up = prom.try_query('up{job="collbench-counters"}')
            return up is not None and sorted(u["value"][1] for u in up) == ["1"] * 4
        assert wait_for(all_up, 40, interval=0.5), prom.log_tail(2000)

        cfg = yaml.safe_load(open(bed["config"]))
        stand_in = StandIn(str(dump_root), hosts)
        mpirun = subprocess.Popen(
            ["ip", "netns", "exec", hosts[0]["netns"], "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4",
             "--hostfile", bed["hostfile"], "--map-by", "node", *cfg["launcher_args"], str(prog), str(SIZE),
             str(QUIET_S + CONGESTED_S)],
            stdout=subprocess.PIPE, stderr=open(tmp_path / "mpirun.log", "wb"), text=True, start_new_session=True)
        reader = threading.Thread(target=lambda: [stand_in.feed(line) for line in mpirun.stdout], daemon=True)
        reader.start()
        time.sleep(QUIET_S)
        testbed.ecn_mark(bed["dir"], {h2["alias"]: "256kbytes"})
        ns(h2, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", "200mbit", "burst", "64kb",
           "latency", "100ms", check=True)
        try:
            assert mpirun.wait(timeout=CONGESTED_S + 60) == 0, (tmp_path / "mpirun.log").read_text()[-3000:]
            reader.join(10)
            marked = testbed.ecn_marked_packets(testbed.load(bed["dir"]), h2["alias"])
        finally:
            ns(h2, "tc", "qdisc", "del", "dev", "eth0", "root", capture_output=True)
            testbed.ecn_clear(bed["dir"], [h2["alias"]])
        stand_in.dump()
        assert marked, "the nftables rule marked nothing"
        per_rank = {}
        for w in stand_in.writers.values():
            per_rank[w.hostname] = sum(1 for _ in open(w.path))
        assert len(per_rank) == 4 and min(per_rank.values()) > 40, per_rank
        time.sleep(3)       # the last intervals scraped

        # each host's exporter followed its own Inspector directory, and Prometheus has it
        ops = prom.query("collbench_inspector_records_total")
        assert sorted(r["metric"]["host"] for r in ops if float(r["value"][1]) > 0) == \
            sorted(h["name"] for h in hosts), ops

        r = subprocess.run([sys.executable, "-m", "collbench", "diagnose", "--inspector", str(dump_root),
                            "--prometheus", prom_url, "--step", "3", "--format", "json"],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
        assert r.returncode == 1, r.stdout + r.stderr
        doc = json.loads(r.stdout)
        (reg,) = doc["regressions"]
        assert reg["op"] == "allreduce" and reg["ratio"] > 1.2, reg
        named = [(s["host"], s["link"], s["cause"], s["detail"]) for s in doc["suspects"]]
        top = doc["suspects"][0]
        assert top["cause"] == "congestion" and h2["name"] in (top["host"], (top["link"] or [None])[0]), named
        first = top["evidence"]["counters"][0]
        assert (first["host"], first["counter"]) == (h2["name"], "TCPDeliveredCE"), top["evidence"]
        assert not [s for s in doc["suspects"] if s["host"] not in (None, h2["name"])], named
    finally:
        if mpirun is not None and mpirun.poll() is None:
            stop_process(mpirun, timeout=10)
        if prom is not None:
            prom.stop()
        for p in exporters:
            stop_process(p, timeout=10)
