"""The nccl-tests / rccl-tests output parser on real published outputs of every form.

Each fixture is an excerpt of a published run (tests/fixtures/nccl_tests/README.md names the
source of each); the expected values below are read off those excerpts.
"""

import json
import random
import re

import pytest

from collbench.engines import nccl_tests_parser as ntp
from collbench.engines.nccl_tests_parser import NcclTestsError, parse
from conftest import FIXTURES

FIX = FIXTURES / "nccl_tests"


def one(name):
    outs = parse((FIX / name).read_bytes())
    assert len(outs) == 1, [o.test for o in outs]
    out = outs[0]
    assert out.bad_lines == 0, out.bad
    return out


# ------------------------------------------------------------------ the README names every fixture

def test_readme_names_every_fixture_and_twelve_published_sources():
    readme = (FIX / "README.md").read_text()
    files = sorted(p.name for p in FIX.iterdir() if p.name != "README.md")
    for name in files:
        assert f"`{name}`" in readme, f"{name} is not described in the README"
    sources = set(re.findall(r"https://\S+", readme))
    published = [s for s in sources if "github.com" in s or "dstack" in s]
    assert len(published) >= 12, published


# ------------------------------------------------------------------ pre-2019

def test_pre2019_header_without_hash_devices_without_pid_and_old_failure():
    out = one("pre2019_nccl1_failure_nccl-tests-5.txt")
    assert out.params["nthread"] == 1 and out.params["ngpus"] == 8 and out.params["iters"] == 20
    assert out.nccl_version == "1.0"
    assert [d.rank for d in out.devices] == list(range(8))
    assert {d.host for d in out.devices} == {"node03"} and out.devices[0].pid is None
    assert out.devices[3].name == "Tesla P100-PCIE-16GB"
    assert out.rows == []
    [f] = out.failures
    assert (f.kind, f.where, f.reason) == ("NCCL", "all_reduce.cu:95", "unhandled cuda error")


def test_pre2019_columns_bytes_n_op_res_in_e_notation():
    out = one("pre2019_rows_nccl-120.txt")
    assert len(out.rows) == 10
    r = out.rows[0]
    assert (r.size, r.count, r.type, r.redop, r.root) == (10000000, 10000000, "char", "sum", None)
    # 2017-2018 printed milliseconds (%7.3f of deltaSec * 1.0E3): 10 MB at 157.38 GB/s is 64 us, not 0.064
    assert (r.oop.time_us, r.oop.algbw_gbs, r.ip.algbw_gbs) == (pytest.approx(64.0), 157.38, 2083.77)
    assert r.oop.algbw_gbs * 1e3 * r.oop.time_us / r.size == pytest.approx(1.0, rel=0.02)
    assert r.oop.wrong == 0.0 and r.oop.wrong_kind == "error" and r.oop.validation == "pass"
    assert [x.redop for x in out.rows[4:8]] == ["sum", "prod", "max", "min"]
    assert out.rows[8].type == "half"


# ------------------------------------------------------------------ before 2.13: per-collective columns

def test_pre213_error_column_in_e_notation():
    out = one("pre213_allreduce_error_enotation_nccl-tests-176.txt")
    assert [r.size for r in out.rows] == [4096, 8192, 16384, 32768, 65536, 131072]
    r = out.rows[-1]
    assert r.root is None and r.redop == "sum"
    assert r.oop.wrong == pytest.approx(1e-06) and r.oop.wrong_kind == "error"
    assert (r.oop.time_us, r.oop.busbw_gbs, r.ip.time_us) == (120.9, 2.15, 117.4)


def test_pre213_device_lines_with_pid_without_group_on_two_hosts():
    out = one("pre213_devices_without_group_nccl-tests-118.txt")
    assert out.ranks == 14 and out.hosts == ["dgx-work01", "dgx-work02"]
    d = out.devices[8]
    assert (d.rank, d.pid, d.group, d.host, d.device, d.bus_id) == (8, 27302, None, "dgx-work02", 0, "0x07")
    assert out.params["minbytes"] == 10737418240


def test_pre213_broadcast_root_column_na_and_warn_lines_between():
    out = one("pre213_broadcast_root_na_warn_nccl-tests-82.txt")
    [r] = out.rows
    assert (r.size, r.type, r.redop, r.root) == (8, "float", None, 0)
    assert r.oop.wrong is None and r.oop.validation == "off" and r.ip.validation == "off"
    assert (r.oop.time_us, r.ip.time_us) == (45.82, 38.17)
    assert out.nccl_version == "2.9.6+cuda11.2"
    assert out.hosts == ["v100-gpu-1", "v100-gpu-5"] and out.params["validation"] == 0
    assert any("libibverbs" in w for w in out.warnings)


def test_pre213_validation_off_na():
    out = one("pre213_allreduce_noval_nccl-tests-78.txt")
    assert len(out.rows) == 6 and all(r.oop.validation == "off" == r.ip.validation for r in out.rows)
    assert out.rows[4].oop.time_us == 16129.0 and out.rows[4].ip.time_us == 14383.0
    assert out.nccl_version == "2.8.4+cuda10.1" and out.devices == []


# ------------------------------------------------------------------ 2.13 and later: 13 columns

def test_v213_group_device_lines_and_13_columns():
    out = one("v213_group_nccl-1039.txt")
    assert [(d.rank, d.group, d.pid, d.device) for d in out.devices] == [(i, 0, 3423, i) for i in range(4)]
    assert [r.size for r in out.rows] == [8, 16, 32, 64]
    r = out.rows[3]
    assert (r.redop, r.root, r.oop.time_us, r.oop.busbw_gbs, r.ip.time_us) == ("sum", -1, 18.59, 0.01, 17.65)
    assert r.oop.wrong == 0 and r.oop.wrong_kind == "count"


def test_v213_alltoall_redop_none_in_place_na_and_footer():
    out = one("v213_alltoall_none_na_nccl-tests-287.txt")
    [r] = out.rows
    assert r.redop == "none" and r.oop.validation == "pass" and r.ip.validation == "off"
    assert r.oop.algbw_gbs == 1715.44 and r.ip.algbw_gbs == 43046.10
    assert out.out_of_bounds == 0 and out.avg_busbw == 0.0


def test_mid_table_failure_keeps_rows_and_names_the_nccl_reason():
    out = one("midtable_failure_nccl-tests-322.txt")
    assert [r.size for r in out.rows] == [1073741824, 2147483648, 4294967296, 8589934592, 17179869184]
    assert out.rows[-1].oop.time_us == 93457.0
    assert len(out.failures) == 2
    f = out.failures[0]
    assert (f.kind, f.where, f.host) == ("NCCL", "common.cu:1204", "HCA-128")
    assert f.reason == "unhandled cuda error (run with NCCL_DEBUG=INFO for details)"
    assert "unhandled cuda error" in f.message() and "HCA-128" in f.message()


def test_collective_test_starting_nccl_info_lines_and_version():
    out = one("starting_info_version_nccl-1812.txt")
    assert out.test == "all_reduce_perf" and out.nccl_version == "2.19.3+cuda12.2"
    assert out.ranks == 4 and out.devices[2].bus_id == "0000:81:00"
    assert not out.concluded


def test_info_and_warn_lines_between_devices_and_table():
    out = one("info_warn_between_nccl-tests-131.txt")
    assert out.ranks == 2 and out.nccl_version == "2.16.5+cuda11.8"
    assert out.devices[1].name == "NVIDIA GeForce GTX 950"
    assert any("Could not find a path for pattern 4" in w for w in out.warnings)


def test_open_mpi_tag_output_prefix():
    out = one("ompi_tag_output_prefix_aws-k8s-tester-503.txt")
    assert [(r.size, r.oop.time_us, r.ip.time_us) for r in out.rows] == [
        (8, 12.90, 12.87), (16, 12.88, 12.83), (32, 22.25, 13.34)]


def test_open_mpi_tags_in_the_middle_of_lines():
    # as Open MPI 4.1.4's mpirun --tag-output printed a rank's output here (tests/nccl_tests_standin
    # under real mpirun): a tag wherever mpirun's read of the pipe ended, not only at line starts
    text = (
        "[1,0]<stdout>:# nThread 1 nGpus 1 minBytes 2097152 maxBytes 2097152 step: 2(factor) warmup iters: 1 "
        "iters: 5 agg iters: 1 validation: 0 graph: 0 unalign: 0[1,0]<stdout>:\n"
        "[1,0]<stdout>:#  Rank  0 Group  0 Pid   7568 on         vm device  0 [0000:00:00] NVIDIA H100[1,0]<stdout>:\n"
        "[1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw  #wrong"
        "     time   algbw   busbw  #wrong [1,0]<stdout>:\n"
        "[1,0]<stdout>:     2097152       2097152      int8    none      -1   114.44   18.33    9.16     N/A"
        "   114.[1,0]<stdout>:27   18.35    9.18     N/A\n")
    [out] = parse(text)
    assert out.bad_lines == 0, out.bad
    assert out.params["unalign"] == 0 and out.devices[0].name == "NVIDIA H100"
    [r] = out.rows
    assert (r.size, r.oop.time_us, r.ip.time_us, r.ip.busbw_gbs) == (2097152, 114.44, 114.27, 9.18)


def test_srun_label_prefix():
    out = one("srun_label_prefix_p4de.txt")
    [r] = out.rows
    assert (r.size, r.oop.time_us, r.oop.busbw_gbs, r.ip.busbw_gbs) == (26214400, 2009.1, 24.46, 26.23)
    assert out.avg_busbw == 25.3468 and out.out_of_bounds == 0


def test_nccl_tests_version_line():
    out = one("version_line_dstack.txt")
    assert (out.version, out.test) == ("2.17.6", "all_reduce_perf")
    assert out.rows[-1].size == 2147483648 and out.rows[-1].ip.busbw_gbs == 702.91
    assert out.avg_busbw == 137.179


def test_per_iteration_columns_and_wrong_in_e_notation():
    out = one("v219_per_iter_from_source.txt")
    assert out.version == "2.19.6" and out.concluded and out.out_of_bounds == 1
    r0, r1 = out.rows
    assert (r0.oop.i_min_us, r0.oop.i_max_us, r0.oop.i_p99_us) == (26.10, 31.20, 31.20)
    assert r0.ip.time_us == 27.49 and r0.ip.i_max_us == 30.90
    assert r1.oop.wrong == 1.04858e+06 and r1.oop.validation == "fail" and r1.ip.validation == "pass"
    assert out.hosts == ["gpunode1", "gpunode2"]


def test_real_2_19_binary_cuda_failure_before_the_devices():
    out = one("real_2.19.6_cuda_failure_no_gpu.txt")
    assert (out.version, out.nccl_version, out.test) == ("2.19.6", "2.32.3", "all_reduce_perf")
    assert out.params["unalign"] == 0 and out.params["maxbytes"] == 67108864 and out.params["step"] == 8
    assert out.devices == [] and out.rows == []
    [f] = out.failures
    assert (f.kind, f.where, f.host) == ("CUDA", "util.cu:674", "vm")
    assert f.reason == "CUDA driver version is insufficient for CUDA runtime version"


def test_nccl_version_codes_of_both_schemes():
    assert ntp.nccl_version_of_code(22803) == "2.28.3" and ntp.nccl_version_of_code(21903) == "2.19.3"
    assert ntp.nccl_version_of_code(2708) == "2.7.8"      # NCCL_VERSION_CODE before 2.9: X*1000+Y*100+Z


def test_reversed_variant_order_is_read_from_the_banner():
    text = ("#                in-place                       out-of-place\n"
            "#       size         count     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong\n"
            "     6291456       1572864    76.21   82.55  144.46      0    80.00   78.64  137.60      0\n")
    [out] = parse(text)
    r = out.rows[0]
    assert r.ip.time_us == 76.21 and r.oop.time_us == 80.00


# ------------------------------------------------------------------ rccl-tests

def test_rccl_params_with_colons_pci_function_and_failure():
    out = one("rccl_failure_colon_params_rccl-tests-50.txt")
    assert out.params["nranks"] == 1 and out.params["warmupiters"] == 5 and out.params["ngpus"] == 4
    assert out.devices[0].bus_id == "0000:63:00.0" and out.devices[0].name == "AMD Instinct MI210"
    assert out.failures[0].reason.startswith("internal error")


def test_rccl_version_line():
    out = one("rccl_version_container-toolkit-77.txt")
    assert out.version == "develop:5272cd1" and out.ranks == 7


def test_rccl_json_lines_and_csv_agree():
    js = one("rccl_json_lines_rccl-tests-93.jsonl")
    cs = one("rccl_csv_from_pr140.csv")
    assert (js.form, cs.form) == ("rccl-json", "rccl-csv")
    for out in (js, cs):
        assert out.test == "all_reduce_perf" and out.ranks == 4
        assert [r.size for r in out.rows] == [1024, 2048]
        assert out.rows[0].oop.time_us == pytest.approx(19.18415)
        assert out.rows[0].ip.time_us == pytest.approx(19.89765)
        assert out.rows[1].oop.busbw_gbs == pytest.approx(0.1581332859757086)


def test_rccl_json_list_form():
    lines = (FIX / "rccl_json_lines_rccl-tests-93.jsonl").read_text().splitlines()
    [out] = parse("[" + ",".join(lines) + "]")
    assert out.form == "rccl-json" and len(out.rows) == 2 and out.rows[1].ip.time_us == pytest.approx(20.2602)


# ------------------------------------------------------------------ nccl-tests -J

def test_json_J_matches_the_text_table_of_the_same_run():
    js = one("json_J_from_source_2.19.json")
    txt = one("v213_group_nccl-1039.txt")
    assert js.form == "json" and js.test == "all_reduce_perf" and js.nccl_version == "2.28.3"
    assert [(d.rank, d.host, d.device) for d in js.devices] == [(d.rank, d.host, d.device) for d in txt.devices]
    assert [(r.size, r.count, r.root, r.oop.time_us, r.ip.time_us, r.oop.busbw_gbs) for r in js.rows] == \
        [(r.size, r.count, r.root, r.oop.time_us, r.ip.time_us, r.oop.busbw_gbs) for r in txt.rows]
    assert js.out_of_bounds == 0 and js.concluded


def test_json_J_bad_entries_are_counted_not_raised():
    doc = json.loads((FIX / "json_J_from_source_2.19.json").read_text())
    doc["results"][1]["out_of_place"]["time"] = "fast"
    doc["results"][2] = [1, 2]
    doc["results"][3]["size"] = -4
    doc["config"]["devices"][0] = {"rank": "zero"}
    [out] = parse(json.dumps(doc))
    assert [r.size for r in out.rows] == [8]
    assert out.bad_lines == 4
    assert any("results[1]" in why and "time" in why for _, why in out.bad)
    assert len(out.devices) == 3


# ------------------------------------------------------------------ untrusted input

def test_bad_rows_are_counted_with_line_and_reason():
    head = (FIX / "v213_group_nccl-1039.txt").read_text().splitlines()[:12]
    rows = ["           8             2     float     sum      -1    19.12    0.00    0.00      0",
            "          16             4     float     sum      -1    fast    0.00    0.00      0    19.53    0.00    0.00      0",
            "          32             8     float     sum      -1    inf    0.00    0.00      0    17.74    0.00    0.00      0",
            "          64            16     float     sum      -1    -18.59    0.00    0.01      0    17.65    0.00    0.01      0",
            "         128            32     fl$at     sum      -1    18.59    0.00    0.01      0    17.65    0.00    0.01      0",
            "9" * 30 + "   32     float     sum      -1    18.59    0.00    0.01      0    17.65    0.00    0.01      0",
            "         256            64     float     sum      -1    18.59    0.00    0.01      0    17.65    0.00    0.01      0",
            "1" + " " * 9000]
    [out] = parse("\n".join(head + rows))
    assert [r.size for r in out.rows] == [256]
    assert out.bad_lines == 7
    reasons = dict(out.bad)
    assert "9 fields, the table header has 13" in reasons[13]
    assert "time 'fast' is not a number" in reasons[14]
    assert "not a finite number" in reasons[15] and "not a finite number" in reasons[16]
    assert "not a datatype name" in reasons[17]
    assert "not a whole number" in reasons[18]
    assert "characters" in reasons[20]


def test_not_nccl_tests_output_is_a_named_error():
    for text in ("", "hello world\n", "{\"a\": 1}", "[1, 2", "name,size\nx,1\n"):
        with pytest.raises(NcclTestsError):
            parse(text)


def test_too_large_input_is_refused(monkeypatch):
    monkeypatch.setattr(ntp, "MAX_INPUT_BYTES", 1000)
    with pytest.raises(NcclTestsError, match="at most 1000"):
        parse(b"#" * 1001)


def test_random_bytes_and_mangled_fixtures_never_raise_anything_else():
    rng = random.Random(22)
    texts = [p.read_bytes() for p in sorted(FIX.iterdir()) if p.name != "README.md"]
    for i in range(400):
        base = bytearray(rng.choice(texts))
        for _ in range(rng.randint(1, 20)):
            pos = rng.randrange(len(base))
            base[pos:pos + rng.randint(0, 8)] = bytes(rng.randrange(256) for _ in range(rng.randint(0, 8)))
        if i % 10 == 0:
            base = bytes(rng.randrange(256) for _ in range(rng.randint(0, 3000)))
        try:
            outs = parse(bytes(base))
        except NcclTestsError:
            continue
        for o in outs:
            assert o.bad_lines >= len(o.bad)
            for r in o.rows:
                for v in (r.oop, r.ip):
                    assert v is None or (v.time_us >= 0 and v.busbw_gbs >= 0)
