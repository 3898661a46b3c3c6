"""An op is one row of collbench.ops.OPS, a datatype one row of collbench.ops.DATATYPE_TABLE:
every row runs in the built-in C engine, and the engine knows no op or datatype the tables lack.
Adding a row without teaching the engine (or changing a fact on one side only) fails here."""

import re
import subprocess
from pathlib import Path

import pytest

from collbench.results import records
from collbench.config import Step
from collbench.engines import get_engine
from collbench.ops import DATATYPE_TABLE, DATATYPES, OPS, default_datatype
from engine_helpers import engine_bin, engine_cfg  # noqa: F401


def test_engine_lists_exactly_the_table_ops(engine_bin):
    usage = subprocess.run([engine_bin, "--help"], capture_output=True, text=True, timeout=60).stdout
    listed = re.search(r"^\s*ops: (.*)$", usage, re.M)
    assert listed, usage
    assert [o.strip() for o in listed.group(1).split(",")] == list(OPS)
    listed = re.search(r"^\s*datatypes: (.*)$", usage, re.M)
    assert listed and [d.strip() for d in listed.group(1).split(",")] == list(DATATYPES)


def every_op_steps():
    """Every row of the table, at an element count that splits unevenly over 3 ranks."""
    steps = []
    for op in OPS.values():
        dt = default_datatype(op)
        size = 1001 * DATATYPES[dt] if op.has_size else 0
        steps.append(Step(op.name, size, 3, 1, dt))
    return steps


@pytest.mark.mpi
def test_every_table_op_is_planned_measured_and_validated_by_the_engine(tmp_path, engine_bin):
    cfg = engine_cfg(tmp_path, engine_bin, ranks=3, validate=True, oversubscribe=True)
    engine = get_engine("builtin")
    steps = every_op_steps()
    engine.preflight(cfg, steps)
    recs = list(engine.run_steps(cfg, steps, records.RunContext(cfg, engine.name, "test")))
    assert [(r["type"], r["op"]) for r in recs] == [("result", s.op) for s in steps], \
        [r.get("error") for r in recs]
    for rec, step in zip(recs, steps):
        op = OPS[step.op]
        assert rec["size_bytes"] == step.size_bytes and rec["datatype"] == step.datatype
        assert rec["validation"] == ("pass" if op.has_size else "off"), rec   # barrier has no data to check
        assert rec["latency_avg_us"] > 0 and rec["ranks"] == 3
        # the table's bandwidth model applied to what the engine measured
        assert (rec["busbw_bytes_per_s"] is None) == (op.bus_factor(3) is None)


ENGINE_SOURCE = Path(__file__).resolve().parent.parent / "collbench" / "engines" / "collbench_engine.c"
C_SIZES = {"short": 2, "int": 4, "float": 4, "double": 8, "long long": 8}   # what this build's C gives


def test_engine_op_rows_agree_with_the_table():
    """The C engine's OPS[]: one row per table op, in order, with the same reduction / has-size
    facts, and each op's call function makes the table's MPI call."""
    src = ENGINE_SOURCE.read_text()
    body = src[src.index("static const OpDef OPS[] = {"):]
    body = body[:body.index("};")]
    rows = re.findall(r'^\s*\{"(\w+)",\s*(\d),\s*(\d),.*?(call_\w+)', body, re.M)
    assert [r[0] for r in rows] == list(OPS)
    for name, reduction, has_size, call in rows:
        op = OPS[name]
        assert (bool(int(reduction)), bool(int(has_size))) == (op.reduction, op.has_size), name
        fn = src[src.index(f"static int {call}("):]
        fn = fn[:fn.index("\n}\n")]
        assert re.search(rf"\b{op.mpi_function}\(", fn), (name, op.mpi_function)


def test_engine_datatype_rows_agree_with_the_table():
    """The C engine's DATATYPES[] and mpi_datatype(): one row per table datatype, in order, with
    the table's element size and MPI type."""
    src = ENGINE_SOURCE.read_text()
    body = src[src.index("} DATATYPES[DT_COUNT] = {"):]
    body = body[:body.index("};")]
    rows = re.findall(r'\{"(\w+)",\s*(?:(\d+)|sizeof\(([\w ]+)\))\}', body)
    assert [r[0] for r in rows] == list(DATATYPE_TABLE)
    for name, literal, c_type in rows:
        assert (int(literal) if literal else C_SIZES[c_type]) == DATATYPE_TABLE[name].size == DATATYPES[name]
    switch = src[src.index("static MPI_Datatype mpi_datatype("):]
    switch = switch[:switch.index("\n}\n")]
    cases = dict(re.findall(r"case DT_(\w+): return (?:reduction && !char_sum_ok \? MPI_SIGNED_CHAR : )?(MPI_\w+);",
                            switch))
    default = re.search(r"default: return (MPI_\w+);", switch).group(1)
    for name, dt in DATATYPE_TABLE.items():
        assert cases.get(name.upper(), default) == dt.mpi, name
