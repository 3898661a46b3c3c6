"""Command-line flags that narrow a loaded config: one override_* function per flag, applied by
apply_overrides in a fixed order. The flags' values are parsed by collbench/cli_values.py, as in
every verb; check_flag and int_flag check a flag's value as the config key it overrides."""

import os
import re


from collbench import cli_values
from collbench.bounded_repr import bounded_repr
from collbench.config.kinds import INT_MAX, MAX_ITERATIONS
from collbench.config.loader import Loader
from collbench.config.model import Host, Step, default_plan, osu_default_iterations
from collbench.errors import UserError
from collbench.ops import DATATYPES, get_op

def check_flag(flag, kind, value):
    """A command-line value checked as the config key it overrides (kind: POS_INT, POS_FLOAT,
    POS_SECONDS ...); ConfigError naming the flag."""
    return Loader("command line", os.getcwd()).value(flag, kind, value)


_INT_FLAG_RE = re.compile(r"^\s*[+-]?[0-9]{1,30}\s*$")


def int_flag(text):
    """argparse type of a whole-number flag (--np, --iterations): argparse's own int error
    repeats the value whole; this one shows it cut to a line. The range is apply_overrides' job."""
    import argparse
    if not _INT_FLAG_RE.match(text):
        raise argparse.ArgumentTypeError(f"invalid int value: {bounded_repr(text)}")
    return int(text)


def apply_overrides(cfg, np=None, ops=None, sizes=None, iterations=None, datatype=None, validate=None):
    """Narrow a config from command-line flags, each by its own override_* function below (in
    this order: a flag's error names it, and ops/sizes/datatype shape the plan before its sizes
    are checked against the datatypes and --iterations is applied). Returns cfg (modified)."""
    if np is not None:
        override_np(cfg, np)
    if datatype is not None:
        override_datatype(cfg, datatype)
    if validate is not None:
        override_validate(cfg, validate)
    if ops is not None:
        override_ops(cfg, ops)
    if sizes is not None:
        override_sizes(cfg, sizes)
    if ops is not None or sizes is not None or datatype is not None:
        check_plan_sizes(cfg.plan, "--sizes")
    if iterations is not None:
        override_iterations(cfg, iterations)
    return cfg


def override_np(cfg, np):
    """--np: the number of ranks (on this machine only, the one host gets that many slots)."""
    cfg.ranks = cli_values.count(np, "--np", 1, INT_MAX)
    if cfg.implicit_hosts:
        cfg.hosts = [Host("localhost", max(cfg.ranks, 1))]


def override_validate(cfg, validate):
    """--validate: check every result element."""
    cfg.validate = validate


def override_datatype(cfg, datatype):
    """--datatype: the datatype of the reductions (and of every op when it is char)."""
    cfg.datatype = cli_values.datatype(datatype, "--datatype")
    cfg.plan = [Step(s.op, s.size_bytes, s.iterations, s.warmup,
                     cfg.datatype if get_op(s.op).reduction or cfg.datatype == "char" else s.datatype,
                     algorithm=s.algorithm, iterations_set=s.iterations_set) for s in cfg.once_plan()]


def override_ops(cfg, ops):
    """--ops: only these ops; one the plan lacks runs at 1MB (or no size), 100 iterations."""
    names = cli_values.op_names(ops, "--ops")
    plan = cfg.once_plan()
    known = {s.op for s in plan}
    extra = [n for n in names if n not in known]
    plan = [s for s in plan if s.op in names]
    for n in extra:
        plan += default_plan([(n, ("1MB",) if get_op(n).has_size else ("0",), 100)], cfg.datatype)
    cfg.plan = plan


def override_sizes(cfg, sizes):
    """--sizes: every op of the plan at these sizes (bytes per rank)."""
    size_list = cli_values.size_list(sizes, "--sizes", as_given=True)
    plan = cfg.once_plan()
    new = []
    for op_name in dict.fromkeys(s.op for s in plan):
        op = get_op(op_name)
        first = next(s for s in plan if s.op == op_name)
        for size in (size_list if op.has_size else [0]):
            # OSU's count for each size, unless the config's plan set one (the built-in
            # default plan's fixed counts are for its own sizes, not configured ones)
            it, wu = osu_default_iterations(size)
            if first.iterations_set:
                it, wu = first.iterations, first.warmup
            new.append(Step(op_name, size, it, wu, first.datatype, algorithm=first.algorithm))
    cfg.plan = new


def override_iterations(cfg, iterations):
    """--iterations: timed iterations of every step (warm-up a tenth, at most the plan's)."""
    it = cli_values.count(iterations, "--iterations", 1, MAX_ITERATIONS)
    cfg.plan = [Step(s.op, s.size_bytes, it, max(1, min(s.warmup, it // 10 or 1)), s.datatype,
                     algorithm=s.algorithm) for s in cfg.once_plan()]


def check_plan_sizes(plan, key):
    """Every step's size a whole number of its datatype's elements; UserError naming key (the flag)."""
    for s in plan:
        if s.size_bytes % DATATYPES[s.datatype]:
            raise UserError(f"{key}: {s.size_bytes} B is not a multiple of the {s.datatype} size "
                            f"({DATATYPES[s.datatype]} B)")
