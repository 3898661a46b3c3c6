"""The OSU output parser against every captured OSU 7.4 file and the synthesized forms."""

import re

import pytest

from collbench.engines.osu_parser import OSU_TITLES, OsuOutputError, parse_columns, parse_output
from conftest import FIXTURES, OSU_FIXTURES

SYNTH = FIXTURES / "osu-synth"
CAPTURED = sorted(OSU_FIXTURES.glob("*.txt"))


def data_lines(text):
    """Result rows counted independently of the parser: lines that start with a number."""
    return [line.split() for line in text.splitlines() if re.match(r"^\s*\d", line)]


def test_captured_fixtures_are_all_there():
    # the parametrized test below must not pass vacuously on an empty directory
    assert len(CAPTURED) >= 16, CAPTURED


@pytest.mark.parametrize("path", CAPTURED, ids=lambda p: p.name)
def test_every_captured_fixture(path):
    text = path.read_text()
    out = parse_output(text)
    op = path.name.split("_np")[0]
    assert {b.op for b in out.blocks} == {op}
    assert all(b.version == "7.4" and b.variant == "" for b in out.blocks)
    rows = [r for b in out.blocks for r in b.rows]
    expected = data_lines(text)
    assert len(rows) == len(expected)
    full = "_full" in path.name
    for row, fields in zip(rows, expected):
        if op == "barrier":
            assert row.size_bytes is None
            assert row.avg_us == float(fields[0])
        else:
            assert row.size_bytes == int(fields[0])
            assert row.avg_us == float(fields[1])
        if full:
            assert row.min_us <= row.avg_us <= row.max_us
            # OSU's defaults: 1000 iterations up to 8 KB, 100 above
            assert row.iterations == (1000 if (row.size_bytes or 0) <= 8192 else 100)
        else:
            assert row.min_us is None and row.max_us is None and row.iterations is None
        assert row.validation is None and row.tail_us == {}
    assert out.validation_error is None


def test_full_row_values():
    out = parse_output((OSU_FIXTURES / "allreduce_np2_full.txt").read_text())
    block = out.block("MPI_CHAR")
    assert block.benchmark == "Allreduce Latency Test"
    assert block.columns == ["Size", "Avg Latency(us)", "Min Latency(us)", "Max Latency(us)", "Iterations"]
    row = block.row_for(1048576)
    assert (row.avg_us, row.min_us, row.max_us, row.iterations) == (195.53, 195.36, 195.70, 100)
    assert block.row_for(8192).avg_us == 5.30
    assert block.row_for(3) is None


def test_datatype_blocks_T_all():
    out = parse_output((OSU_FIXTURES / "allreduce_np2_Tall.txt").read_text())
    assert [b.datatype for b in out.blocks] == ["MPI_CHAR", "MPI_INT", "MPI_FLOAT"]
    # 4-byte types skip sizes below one element
    assert out.blocks[0].rows[0].size_bytes == 1
    assert out.block("MPI_INT").rows[0].size_bytes == 4
    assert out.block("mpi_float").row_for(1048576).avg_us == 195.30
    assert out.block("MPI_INT").row_for(1048576).avg_us == 195.73
    assert out.block("MPI_DOUBLE") is None


def test_message_size_range():
    out = parse_output((OSU_FIXTURES / "bcast_np2_m1024-4194304.txt").read_text())
    sizes = [r.size_bytes for r in out.blocks[0].rows]
    assert sizes == [1024 << i for i in range(13)]
    assert out.blocks[0].row_for(4194304).avg_us == 362.78


def test_barrier_has_no_size_column():
    out = parse_output((OSU_FIXTURES / "barrier_np2_full.txt").read_text())
    block = out.blocks[0]
    assert block.columns == ["Avg Latency(us)", "Min Latency(us)", "Max Latency(us)", "Iterations"]
    assert block.datatype is None
    assert block.row_for(0).avg_us == 0.32 and block.row_for(0).iterations == 1000


# ------------------------------------------------------------------ synthesized forms

def synth(name):
    return parse_output((SYNTH / name).read_text())


def test_synth_dir_has_readme_for_every_file():
    readme = (SYNTH / "README.md").read_text()
    files = sorted(p.name for p in SYNTH.glob("*.txt"))
    assert len(files) >= 10
    for name in files:
        assert f"`{name}`" in readme, name


def test_v5_header_without_datatype():
    out = synth("allreduce_v5.6.3_np4_full.txt")
    block = out.blocks[0]
    assert (block.op, block.version, block.datatype) == ("allreduce", "5.6.3", None)
    assert out.block("MPI_FLOAT") is block  # 5.x prints no datatype: any request matches
    row = block.row_for(16384)
    assert (row.avg_us, row.min_us, row.max_us, row.iterations) == (26.40, 25.95, 26.92, 100)
    assert len(block.rows) == 8


def test_v5_without_full_and_v5_barrier():
    bcast = synth("bcast_v5.3.2_np4.txt").blocks[0]
    assert (bcast.op, bcast.version, bcast.columns) == ("bcast", "5.3.2", ["Size", "Avg Latency(us)"])
    assert bcast.row_for(1048576).avg_us == 611.24
    barrier = synth("barrier_v5.6.3_np4_full.txt").blocks[0]
    assert barrier.op == "barrier" and barrier.rows[0].size_bytes is None
    assert (barrier.rows[0].avg_us, barrier.rows[0].max_us) == (3.41, 3.45)


def test_validation_column_pass():
    out = synth("allreduce_np4_full_validate.txt")
    block = out.block("MPI_FLOAT")
    assert block.columns[-1] == "Validation"
    assert [r.validation for r in block.rows] == ["pass"] * 4
    assert block.row_for(65536).iterations == 100
    assert out.validation_error is None


def test_validation_failure_stops_the_size_loop():
    out = synth("allreduce_np4_validate_fail.txt")
    block = out.block("MPI_INT")
    assert [(r.size_bytes, r.validation) for r in block.rows] == [(4, "pass"), (8, "pass"), (16, "fail")]
    assert out.validation_error.startswith("DATA VALIDATION ERROR:")
    assert "message size 16" in out.validation_error


def test_tail_latency_default_percentiles():
    block = synth("reduce_np4_z.txt").blocks[0]
    assert block.columns == ["Size", "Avg Latency(us)", "P50 Tail Lat(us)", "P90 Tail Lat(us)", "P99 Tail Lat(us)"]
    assert block.row_for(1048576).tail_us == {50: 698.40, 90: 715.02, 99: 760.33}
    assert block.row_for(1048576).avg_us == 702.18


def test_tail_latency_with_full_and_validation():
    block = synth("alltoall_np4_full_validate_z5,95,99.txt").blocks[0]
    assert block.op == "alltoall"
    assert block.columns[4:] == ["Iterations", "Validation", "P5 Tail Lat(us)", "P95 Tail Lat(us)", "P99 Tail Lat(us)"]
    row = block.row_for(1048576)
    assert (row.min_us, row.max_us, row.iterations, row.validation) == (2190.12, 2231.80, 100, "pass")
    assert row.tail_us == {5: 2150.00, 95: 2290.31, 99: 2402.77}


def test_barrier_with_tails():
    row = synth("barrier_np4_full_z.txt").blocks[0].rows[0]
    assert (row.size_bytes, row.avg_us, row.iterations, row.tail_us[99]) == (None, 2.95, 1000, 5.12)


def test_two_datatype_flags_two_blocks():
    out = synth("reduce_scatter_np4_full_T_int_float.txt")
    assert [(b.op, b.datatype, len(b.rows)) for b in out.blocks] == [
        ("reduce_scatter", "MPI_INT", 3), ("reduce_scatter", "MPI_FLOAT", 3)]
    assert out.block("MPI_FLOAT").row_for(4096).avg_us == round(9.5 * 1.1, 2)


def test_usage_text_is_an_error_carrying_the_text():
    text = (SYNTH / "usage_help_v7.4.txt").read_text()
    with pytest.raises(OsuOutputError) as e:
        parse_output(text)
    assert "usage text" in str(e.value) and "Usage: osu_allreduce [options]" in str(e.value)
    assert e.value.text == text


def test_version_only_has_no_rows():
    with pytest.raises(OsuOutputError, match="no result rows under 'Allreduce Latency Test'"):
        parse_output((SYNTH / "version_v7.4.txt").read_text())


def test_truncated_row_names_line_and_columns():
    with pytest.raises(OsuOutputError, match=r"line 6: 2 values under 5 columns"):
        parse_output((SYNTH / "bcast_truncated_row.txt").read_text())


@pytest.mark.parametrize("text,message", [
    ("", "no '# OSU MPI ...' title"),
    ("This test requires at least two processes\n", "no '# OSU MPI ...' title"),
    ("# Size       Avg Latency(us)\n1   0.5\n", "column header before any"),
    ("# OSU MPI Allreduce Latency Test v7.4\n# Datatype: MPI_CHAR.\n"
     "# Size       Avg Latency(us)\n1       abc\n", "'abc' is not a valid 'Avg Latency(us)'"),
    ("# OSU MPI Allreduce Latency Test v7.4\n# Size       Avg Latency(us)        Validation\n"
     "1       0.5     Maybe\n", "'Maybe' is not a valid 'Validation'"),
])
def test_bad_output(text, message):
    with pytest.raises(OsuOutputError) as e:
        parse_output(text)
    assert message in str(e.value)


def test_accelerator_variant_and_noise_lines():
    text = ("[host:1234] some MPI warning on stdout\n\n# OSU MPI-CUDA Broadcast Latency Test v7.4\n"
            "# Datatype: MPI_CHAR.\n# Size       Avg Latency(us)\n1024                    3.21\n")
    out = parse_output(text)
    block = out.blocks[0]
    assert (block.variant, block.op, block.row_for(1024).avg_us) == ("-CUDA", "bcast", 3.21)
    assert out.ignored == ["[host:1234] some MPI warning on stdout"]


def test_title_table_names_every_op():
    from collbench.ops import OPS
    assert sorted(OSU_TITLES.values()) == sorted(OPS)


def test_parse_columns_keeps_single_spaces():
    assert parse_columns("# Size       Avg Latency(us)  P50 Tail Lat(us)") == [
        "Size", "Avg Latency(us)", "P50 Tail Lat(us)"]


def test_mpirun_tag_output_prefix():
    text = (OSU_FIXTURES / "bcast_np2_full.txt").read_text()
    tagged = "".join(f"[1,0]<stdout>:{line}\n" for line in text.splitlines())
    assert parse_output(tagged).blocks[0].row_for(1048576).max_us == 55.85
