"""The matrix file format: round trips, and every defect of an untrusted file rejected through the
real CLI with exit 2, the file and the cell named, and nothing written."""

import json
import subprocess
import sys

import pytest

from collbench.pair_matrix import (MAX_FILE_BYTES, MAX_LABELS, MatrixError, TopoMatrix, csv_text, json_text,
                                   load_matrices, load_matrix, save_csv, save_json)

HOSTS = ["node0", "node1", "node2"]
GOOD = [[None, 10.0, 50.0], [10.5, None, 48.0], [51.0, 49.0, None]]


def good_matrix(metric="latency"):
    return TopoMatrix.from_rows(HOSTS, metric, GOOD)


def run_map(path, out_dir, *extra):
    return subprocess.run([sys.executable, "-m", "collbench", "topo", "map", "--pattern", "ring",
                           "--matrix", str(path), "--out-dir", str(out_dir), *extra],
                          capture_output=True, text=True, timeout=120)


def test_csv_and_json_round_trip(tmp_path):
    lat = good_matrix("latency")
    bw = TopoMatrix.from_rows(HOSTS, "bandwidth", [[None, 9.5, 1.25], [9.4, None, 1.3], [1.2, 1.3, None]])
    save_csv(tmp_path / "lat.csv", lat)
    save_json(tmp_path / "both.json", [lat, bw], {"rounds": 2, "concurrent": False})
    text = (tmp_path / "lat.csv").read_text()
    assert text.splitlines()[0] == "latency_us,node0,node1,node2"
    assert text.splitlines()[1] == "node0,,10.0,50.0"
    back = load_matrix(str(tmp_path / "lat.csv"))
    assert back.labels == lat.labels and back.values == lat.values and back.metric.name == "latency"
    both = load_matrices(str(tmp_path / "both.json"))
    assert set(both) == {"latency", "bandwidth"}
    assert both["bandwidth"].values == bw.values
    assert both["latency"].meta == {"rounds": 2, "concurrent": False}
    # the default of a file with both: bandwidth; --metric picks
    assert load_matrix(str(tmp_path / "both.json")).metric.name == "bandwidth"
    assert load_matrix(str(tmp_path / "both.json"), "latency").values == lat.values
    doc = json.loads(json_text([lat]))
    assert doc["format"] == "collbench-topo-matrix" and doc["hosts"] == HOSTS
    assert doc["latency_us"][0] == [None, 10.0, 50.0]
    assert csv_text(back) == text


def test_cost_is_symmetric_and_takes_the_slower_direction():
    lat = good_matrix()
    c = lat.cost()
    assert c[0][1] == c[1][0] == 10.5 and c[0][0] == 0.0
    bw = TopoMatrix.from_rows(["a", "b"], "bandwidth", [[None, 2.0], [4.0, None]])
    assert bw.cost()[0][1] == 500.0            # 1 MB at the slower 2 GB/s: 500 us
    assert bw.pair_value(0, 1) == 2.0


def test_labels_with_slots():
    m = TopoMatrix.from_rows(["n1:0", "n1:1", "n2"], "latency", GOOD)
    assert m.hosts == ("n1", "n1", "n2")


def test_diagonal_may_hold_a_number_or_dash(tmp_path):
    f = tmp_path / "m.csv"
    f.write_text("latency_us,a,b\na,0,5\nb,5,-\n")
    m = load_matrix(str(f))
    assert m.values == ((None, 5.0), (5.0, None))


CSV_CASES = [
    ("nonsquare_rows", "latency_us,a,b,c\na,,1,2\nb,1,,2\n", "2 data rows for 3 hosts"),
    ("nonsquare_cells", "latency_us,a,b\na,,1,7\nb,1,\n", "line 2: 4 cells, expected 3"),
    ("nan", "latency_us,a,b\na,,nan\nb,1,\n", "line 2 column 3 (a -> b): got nan"),
    ("inf", "latency_us,a,b\na,,1\nb,Infinity,\n", "line 3 column 2 (b -> a): got Infinity"),
    ("negative", "latency_us,a,b\na,,-3\nb,1,\n", "line 2 column 3 (a -> b): got -3, negative"),
    ("zero", "bandwidth_GBps,a,b\na,,0\nb,1,\n", "line 2 column 3 (a -> b): got 0"),
    ("text", "latency_us,a,b\na,,fast\nb,1,\n", "line 2 column 3 (a -> b): got 'fast'"),
    ("underscore", "latency_us,a,b\na,,1_000\nb,1,\n", "got '1_000'"),
    ("missing", "latency_us,a,b\na,,\nb,1,\n", "line 2 column 3 (a -> b): missing value"),
    ("unicode_digits", "latency_us,a,b\na,,\u0661\u0662\nb,1,\n", "line 2 column 3 (a -> b): got"),
    ("long_cell", "latency_us,a,b\na,,0." + "0" * 70 + "1\nb,1,\n", "73-character cell"),
    ("bad_diagonal", "latency_us,a,b\na,x,1\nb,1,\n", "line 2 column 2 (a -> a): got 'x'"),
    ("huge_value", "latency_us,a,b\na,,1e300\nb,1,\n", "got 1e+300, expected a positive number from"),
    ("huge_cell", "latency_us,a,b\na,," + "1" * 100 + "\nb,1,\n", "100-character cell"),
    ("bad_metric", "latency_ms,a,b\na,,1\nb,1,\n", "line 1 column 1: got 'latency_ms'"),
    ("dup_host", "latency_us,a,a\na,,1\na,1,\n", "line 1 (header)[1]: 'a' repeats"),
    ("bad_host", "latency_us,a,b;rm\na,,1\nb;rm,1,\n", "line 1 (header)[1]: got 'b;rm'"),
    ("row_label", "latency_us,a,b\na,,1\nc,1,\n", "line 3 column 1: got 'c', expected 'b'"),
    ("one_host", "latency_us,a\na,\n", "1 host(s): a matrix needs at least 2"),
    ("empty", "  \n\n", "empty file"),
]


@pytest.mark.parametrize("name,text,message", CSV_CASES, ids=[c[0] for c in CSV_CASES])
def test_bad_csv_exits_2_naming_file_and_cell(tmp_path, name, text, message):
    f = tmp_path / f"{name}.csv"
    f.write_text(text)
    out = tmp_path / "out"
    r = run_map(f, out)
    assert r.returncode == 2, r.stderr
    assert str(f) in r.stderr and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()                        # nothing half-written


JSON_CASES = [
    ("not_object", [1, 2], "got a JSON list"),
    ("no_hosts", {"latency_us": [[None, 1], [1, None]]}, "hosts: missing"),
    ("hosts_not_list", {"hosts": "a,b", "latency_us": [[None, 1], [1, None]]}, "hosts: got 'a,b'"),
    ("host_number", {"hosts": ["a", 7], "latency_us": [[None, 1], [1, None]]}, "hosts[1]: got 7"),
    ("no_matrix", {"hosts": ["a", "b"]}, "no matrix"),
    ("unknown_key", {"hosts": ["a", "b"], "latency": [[None, 1], [1, None]]}, "latency: unknown key"),
    ("rows_not_list", {"hosts": ["a", "b"], "latency_us": {"a": 1}}, "latency_us: got {'a': 1}"),
    ("nonsquare", {"hosts": ["a", "b"], "latency_us": [[None, 1]]}, "1 rows for 2 hosts"),
    ("short_row", {"hosts": ["a", "b"], "latency_us": [[None, 1], [1]]}, "latency_us[1] (host b): 1 values"),
    ("row_not_list", {"hosts": ["a", "b"], "latency_us": [[None, 1], 5]}, "latency_us[1] (host b): got 5"),
    ("nested_deeper", {"hosts": ["a", "b"], "latency_us": [[None, [1]], [1, None]]},
     "latency_us[0][1] (a -> b): got [1]"),
    ("string_value", {"hosts": ["a", "b"], "latency_us": [[None, "x"], [1, None]]}, "latency_us[0][1] (a -> b): got 'x'"),
    ("bool_value", {"hosts": ["a", "b"], "latency_us": [[None, True], [1, None]]}, "latency_us[0][1] (a -> b): got True"),
    ("null_value", {"hosts": ["a", "b"], "latency_us": [[None, None], [1, None]]}, "latency_us[0][1] (a -> b): missing"),
    ("negative", {"hosts": ["a", "b"], "latency_us": [[None, 1], [-2.5, None]]}, "latency_us[1][0] (b -> a): got -2.5, negative"),
    ("bad_format", {"format": "other", "hosts": ["a", "b"], "latency_us": [[None, 1], [1, None]]}, "format: got 'other'"),
    ("bad_version", {"version": 2, "hosts": ["a", "b"], "latency_us": [[None, 1], [1, None]]}, "version: got 2"),
    ("meta_not_object", {"hosts": ["a", "b"], "meta": [], "latency_us": [[None, 1], [1, None]]}, "meta: got []"),
]


@pytest.mark.parametrize("name,doc,message", JSON_CASES, ids=[c[0] for c in JSON_CASES])
def test_bad_json_exits_2_naming_file_and_key(tmp_path, name, doc, message):
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps(doc))
    out = tmp_path / "out"
    r = run_map(f, out)
    assert r.returncode == 2, r.stderr
    assert str(f) in r.stderr and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()


RAW_JSON_CASES = [
    ("nan_literal", '{"hosts": ["a", "b"], "latency_us": [[null, NaN], [1, null]]}', "latency_us[0][1] (a -> b): got NaN"),
    ("inf_literal", '{"hosts": ["a", "b"], "latency_us": [[null, 1], [-Infinity, null]]}', "got -Infinity"),
    ("huge_float", '{"hosts": ["a", "b"], "latency_us": [[null, 1e999], [1, null]]}', "got inf"),
    ("huge_int", '{"hosts": ["a", "b"], "latency_us": [[null, ' + "9" * 5000 + '], [1, null]]}', "got 99999999999999999..."),
    ("deep", '{"hosts": ["a", "b"], "latency_us": ' + "[" * 100000 + "]" * 100000 + "}", "nested too deeply"),
    ("broken", '{"hosts": ["a", "b"], "latency_us": [[null, 1], [1, null]]', "not valid JSON"),
]


@pytest.mark.parametrize("name,text,message", RAW_JSON_CASES, ids=[c[0] for c in RAW_JSON_CASES])
def test_hostile_json_exits_2(tmp_path, name, text, message):
    f = tmp_path / f"{name}.json"
    f.write_text(text)
    r = run_map(f, tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert str(f) in r.stderr and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_binary_and_oversized_files_exit_2(tmp_path):
    nul = tmp_path / "nul.csv"
    nul.write_bytes(b"latency_us,a,b\na,,1\x00\nb,1,\n")
    bad_utf8 = tmp_path / "latin1.csv"
    bad_utf8.write_bytes(b"latency_us,a,b\na,,1\nb\xe9,1,\n")
    big = tmp_path / "big.csv"
    with open(big, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)             # sparse: the size alone is refused
    for path, message in ((nul, "NUL byte"), (bad_utf8, "not UTF-8"), (big, "bytes")):
        r = run_map(path, tmp_path / "out")
        assert r.returncode == 2 and str(path) in r.stderr and message in r.stderr, r.stderr


def test_too_many_hosts_and_missing_files(tmp_path):
    many = tmp_path / "many.csv"
    many.write_text("latency_us," + ",".join(f"h{i}" for i in range(MAX_LABELS + 1)) + "\n")
    r = run_map(many, tmp_path / "out")
    assert r.returncode == 2 and f"more than the limit of {MAX_LABELS}" in r.stderr, r.stderr
    r = run_map(tmp_path / "absent.csv", tmp_path / "out")
    assert r.returncode == 2 and "absent.csv: no such file" in r.stderr
    r = run_map(tmp_path, tmp_path / "out")
    assert r.returncode == 2 and "is a directory" in r.stderr


def test_missing_metric_in_file_exits_2(tmp_path):
    f = tmp_path / "lat.json"
    save_json(f, [good_matrix()])
    r = run_map(f, tmp_path / "out", "--metric", "bandwidth")
    assert r.returncode == 2 and "has no bandwidth_GBps matrix" in r.stderr


def test_exact_beyond_its_limit_exits_2(tmp_path):
    p = 17
    m = TopoMatrix.from_rows([f"h{i}" for i in range(p)], "latency",
                             [[None if i == j else 1.0 + abs(i - j) for j in range(p)] for i in range(p)])
    f = tmp_path / "m17.csv"
    save_csv(f, m)
    r = run_map(f, tmp_path / "out", "--method", "exact")
    assert r.returncode == 2 and "limited to 16" in r.stderr
    assert not (tmp_path / "out").exists()


def test_from_rows_validates_like_the_files():
    with pytest.raises(MatrixError, match=r"latency_us\[1\]\[0\] \(b -> a\): got NaN"):
        TopoMatrix.from_rows(["a", "b"], "latency", [[None, 1.0], [float("nan"), None]])
    with pytest.raises(MatrixError, match="unknown metric"):
        TopoMatrix.from_rows(["a", "b"], "hops", [[None, 1.0], [1.0, None]])
