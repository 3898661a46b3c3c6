"""An op is one row of collbench.ops.OPS: every row runs in the built-in C engine, and the engine
knows no op the table lacks. Adding a row without teaching the engine fails here."""

import re
import subprocess

import pytest

from collbench.results import records
from collbench.config import Step
from collbench.engines import get_engine
from collbench.ops import DATATYPES, OPS, default_datatype
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
