"""The sweep's sizes and steps.

Sizes as nccl-tests' -b/-e/-f: from --min-bytes, multiplied by --factor while at most
--max-bytes (so --max-bytes is included only when the factor reaches it exactly), or the
explicit --sizes list. Every size gets OSU's iteration count (1000 timed + 100 warm-up up to
8KB, 100 + 10 above: config.osu_default_iterations) unless --iterations / --warmup set one.
Sizes are bytes per rank and must be whole elements of each op's datatype.
"""

from collbench import cli_values
from collbench.config import Step, osu_default_iterations
from collbench.errors import UserError
from collbench.ops import DATATYPES, default_datatype, get_op
from collbench.sizes import format_size

DEFAULT_MIN_BYTES = "4"          # one float: the smallest size every default datatype can hold
DEFAULT_MAX_BYTES = "1MB"        # OSU's default largest collective message
DEFAULT_FACTOR = 2
MAX_FACTOR = cli_values.MAX_FACTOR
DEFAULT_OPS = "allreduce"


def parse_ops(values):
    """Op names from --op/--ops values (each a comma list), in order, each once; UserError if bad."""
    return cli_values.op_names(values or [DEFAULT_OPS], "--op")


def size_range(min_bytes, max_bytes, factor):
    """[min, min*f, min*f^2, ...] up to max (bytes), as nccl-tests' -b/-e/-f."""
    return cli_values.size_range(min_bytes, max_bytes, factor)


def size_list(text):
    """--sizes 1KB,64KB,1MB -> sorted distinct bytes."""
    return cli_values.size_list(text, "--sizes")


def datatype_for(op, flag_datatype, config_datatype):
    """--datatype applies to every op; the config's datatype to reductions (as its plan does);
    otherwise float for reductions, char for the others."""
    if flag_datatype:
        return flag_datatype
    if config_datatype and op.reduction:
        return config_datatype
    return default_datatype(op)


def build_steps(op_names, sizes, datatype=None, config_datatype=None, iterations=None, warmup=None,
                samples=True):
    """One Step per (op, size), ops in the given order, sizes ascending; barrier gets one step."""
    cli_values.datatype(datatype)
    it_flag = cli_values.count(iterations, "--iterations")
    wu_flag = cli_values.count(warmup, "--warmup", low=0)
    steps = []
    for name in op_names:
        op = get_op(name)
        dt = datatype_for(op, datatype, config_datatype)
        width = DATATYPES[dt]
        for size in (sizes if op.has_size else [0]):
            if size % width:
                raise UserError(f"size {format_size(size)} ({size} B) is not a whole number of {dt} elements "
                                f"({width} B) for {op.name}: choose sizes that are multiples of {width} "
                                "(--min-bytes/--sizes) or another --datatype")
            it, wu = osu_default_iterations(size)
            if it_flag is not None:
                it = it_flag
                wu = max(1, min(wu, it // 10 or 1)) if wu_flag is None else wu_flag
            elif wu_flag is not None:
                wu = wu_flag
            steps.append(Step(op.name, size, it, wu, dt, samples=samples))
    return steps
