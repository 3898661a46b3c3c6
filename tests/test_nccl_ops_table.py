"""The NCCL op table (collbench/nccl/formats.py) against collbench's own op table (collbench/ops.py):
the third op table of the project is kept in sync by this test (the C engine's table is checked
against ops.py by the engine tests)."""

import pytest

from collbench import ops
from collbench.nccl import formats
from collbench.nccl.replay_plan import plan_call


def mapped():
    return [op for op in formats.OPS.values() if op.collbench_op]


def test_every_collbench_op_with_data_has_exactly_one_nccl_op():
    targets = [op.collbench_op for op in mapped()]
    assert len(targets) == len(set(targets))
    assert set(targets) == {name for name, op in ops.OPS.items() if op.has_size}     # all but barrier
    for op in mapped():
        assert ops.get_op(op.collbench_op).name == op.collbench_op


@pytest.mark.parametrize("name", [op.name for op in mapped()])
def test_reduction_and_sizes_agree_with_the_collbench_row(name):
    op = formats.OPS[name]
    ours = ops.get_op(op.collbench_op)
    assert op.reduction == ours.reduction
    assert op.kind == formats.COLL
    # nccl-tests' S of a call equals collbench's S (data_bytes) of the engine size the replay times
    for count in (1, 7, 4096):
        for type_size, datatype in ((1, "int8"), (2, "bfloat16"), (4, "float32"), (8, "float64")):
            for n in (2, 3, 8):
                call = plan_call(name, count, datatype, n, False, 0, 1 << 40)
                assert call.bytes_per_call == op.bytes_per_call(count, type_size, n)
                assert ours.data_bytes(call.size_bytes, n) == op.bytes_per_call(count, type_size, n)


def test_in_place_offsets_only_where_nccl_defines_them():
    offsets = {op.name: op.inplace_offset for op in formats.OPS.values() if op.inplace_offset}
    assert offsets == {"AllGather": 1, "ReduceScatter": -1}
    from collbench.nccl.log_parser import OFFSET_OPS
    assert set(OFFSET_OPS) == set(offsets)


def test_ops_without_a_collbench_row_say_whether_they_reduce():
    for op in formats.OPS.values():
        if not op.collbench_op:
            assert op.reduction is False and op.rooted is True, op
