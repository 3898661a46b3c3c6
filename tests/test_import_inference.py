"""The op inference of `collbench import nccl-tests` on the ops no published table was found for
(hypercube, scatter, gather, alltoallv: tests/fixtures/nccl_tests_real/README.md says what was
searched). Their rows are printed here as nccl-tests 2.19.6 prints them (src/util.cu
writeBenchmarkLinePreamble `"%12li  %12li  %8s  %6s  %6s"` and writeBenchmarkLineBody
`"  %7s  %6s  %6s  %6g"`), with the figures each test's GetBw gives (src/<test>.cu), so the ratios
are nccl-tests' own. Plus the op table rows these ops need and the places that must refuse them."""

import json
import subprocess
import sys

import pytest

from collbench.config.loader import build_config
from collbench.engines.nccl_tests_parser import parse
from collbench.errors import ConfigError
from collbench.import_results.infer import infer_from_table
from collbench.ops import ALL_OPS, IMPORTED_OPS, OPS, get_op
from collbench.results.record_parser import parse_record
from conftest import REPO

HEADER = """#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""


def row(size, opname, root, time_us, algbw, busbw, ip_wrong="0"):
    """One table row as nccl-tests 2.19.6 prints it (float, 4-byte elements)."""
    pre = "%12li  %12li  %8s  %6s  %6s" % (size, size // 4, "float", opname, "%6i" % root)
    body = "  %7s  %6s  %6s  %6g" % ("%7.2f" % time_us, "%6.2f" % algbw, "%6.2f" % busbw, 0)
    ip = "  %7s  %6s  %6s  %6s" % ("%7.2f" % time_us, "%6.2f" % algbw, "%6.2f" % busbw, ip_wrong)
    return pre + body + ip + "\n"


def table(rows):
    return HEADER + "".join(rows)


def bw(op, size, time_us, n):
    """(algbw, busbw) in GB/s as the test's GetBw computes them for a printed size."""
    base = {"hypercube": size * (n - 1) / n}.get(op, size) / 1e9 / (time_us * 1e-6)
    return base, base * ALL_OPS[op].bus_factor(n)


def rows_of(op, opname, root, n, ip_wrong="0"):
    out = []
    for size, t in ((1 << 20, 40.0), (1 << 24, 300.0), (1 << 28, 4000.0)):
        algbw, busbw = bw(op, size, t, n)
        out.append(row(size, opname, root, t, algbw, busbw, ip_wrong))
    return out


def test_hypercube_empty_redop_and_its_ratio():
    [out] = parse(table(rows_of("hypercube", "", -1, 4)))
    assert [r.redop for r in out.rows] == ["", "", ""] and len(out.rows) == 3      # one field fewer
    inf = infer_from_table(out)
    assert (inf.op, inf.ranks) == ("hypercube", 4)
    assert inf.ranks_how == "4 ranks from algbw x time / size 0.750 ((n-1)/n of hypercube)"


def test_scatter_and_gather_print_alike_so_the_import_asks(tmp_path):
    [out] = parse(table(rows_of("scatter", "none", 0, 4)))
    inf = infer_from_table(out, ranks=4)
    assert inf.op is None and inf.candidates == ["scatter", "gather"]
    f = tmp_path / "paste.txt"
    f.write_text(table(rows_of("scatter", "none", 0, 4)))
    p = subprocess.run([sys.executable, "-m", "collbench", "import", "nccl-tests", f], capture_output=True,
                       text=True, cwd=REPO, timeout=60)
    assert p.returncode == 2 and "the table fits scatter, gather" in p.stderr and "give --op" in p.stderr
    out_file = tmp_path / "r.jsonl"
    p = subprocess.run([sys.executable, "-m", "collbench", "import", "nccl-tests", f, "--op", "scatter",
                        "--results", out_file, "--format", "json"], capture_output=True, text=True, cwd=REPO,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    [summary] = json.loads(p.stdout)
    assert summary["ranks"] == 4 and summary["ranks_from"].startswith("4 ranks from busbw/algbw 0.750")
    recs = [parse_record(line) for line in out_file.read_text().splitlines()]
    assert [r["size_bytes"] for r in recs] == [(1 << 20) // 4, (1 << 24) // 4, (1 << 28) // 4]
    for rec, (size, t) in zip(recs, ((1 << 20, 40.0), (1 << 24, 300.0), (1 << 28, 4000.0))):
        assert rec["busbw_bytes_per_s"] == pytest.approx(bw("scatter", size, t, 4)[1] * 1e9, rel=1e-6)


def test_alltoall_family_by_its_unchecked_in_place_result():
    [out] = parse(table(rows_of("alltoall", "none", -1, 8, ip_wrong="N/A")))
    inf = infer_from_table(out)
    assert inf.op is None and inf.candidates == ["alltoall", "alltoallv"]
    [out] = parse(table(rows_of("allgather", "none", -1, 8)))
    assert (infer_from_table(out).op, infer_from_table(out).ranks) == ("allgather", 8)


def test_op_table_rows_of_the_imported_ops():
    assert list(IMPORTED_OPS) == ["sendrecv", "scatter", "gather", "hypercube", "alltoallv"]
    assert not set(IMPORTED_OPS) & set(OPS) and all(not op.measured for op in IMPORTED_OPS.values())
    # nccl-tests' factors: sendrecv 1, scatter/gather/alltoallv (n-1)/n, hypercube 1 over S = size x (n-1)
    assert [get_op(o).bus_factor(8) for o in IMPORTED_OPS] == [1.0, 7 / 8, 7 / 8, 1.0, 7 / 8]
    assert get_op("hypercube").bandwidth(1000, 4, 1.0) == (3e9, 3e9)
    assert get_op("send_recv").name == "sendrecv"


def test_plans_and_thresholds_refuse_an_op_no_engine_runs(tmp_path):
    with pytest.raises(ConfigError, match=r"plan\[0\]\.op: got 'sendrecv', expected one of: allreduce"):
        build_config({"plan": [{"op": "sendrecv", "sizes": ["1KB"], "iterations": 5}]}, "c.yaml", str(tmp_path))
    with pytest.raises(ConfigError, match=r"thresholds\.latency\.scatter: unknown op"):
        build_config({"thresholds": {"latency": {"scatter": {"1KB": {"warning": "1ms", "critical": "2ms"}}}}},
                     "c.yaml", str(tmp_path))
