"""The flags every `collbench compare` engine reads the same way: ops, sizes and the block policy."""

from collbench import cli_values
from collbench.compare import stats
from collbench.compare.blocks import Policy
from collbench.errors import UserError

MAX_SIZES = 64
MAX_BUDGET_S = 7 * 86400


def parse_ops(args):
    if args.op is not None:
        return cli_values.op_names(args.op, "--op", one=True)
    return cli_values.op_names(args.ops, "--ops")


def parse_sizes(args):
    """The sizes to run: --sizes, or the sweep from --min-bytes by --factor up to --max-bytes."""
    if args.sizes is not None:
        sizes = cli_values.size_list(args.sizes, "--sizes")
    else:
        sizes = cli_values.size_range(args.min_bytes, args.max_bytes, args.factor, max_sizes=MAX_SIZES)
    if len(sizes) > MAX_SIZES:
        raise UserError(f"{len(sizes)} sizes: at most {MAX_SIZES} (raise --factor or narrow the range)")
    return sizes


def policy(args):
    """The blocks, time budget and margin of --blocks (--repeats), --time-budget and --margin."""
    if args.blocks is not None and args.repeats is not None and args.blocks != args.repeats:
        raise UserError("--repeats is the older name of --blocks: give one of them")
    blocks = cli_values.count(args.blocks if args.blocks is not None else args.repeats,
                              "--blocks" if args.blocks is not None else "--repeats", 1, stats.MAX_BLOCKS)
    budget = cli_values.number(args.time_budget, "--time-budget", 1, MAX_BUDGET_S,
                               f"a number of seconds from 1 to {MAX_BUDGET_S}")
    margin = cli_values.number(args.margin, "--margin", 0, 100, "a percentage from 0 to 100") / 100.0
    return Policy(blocks=blocks, budget_s=budget, margin=margin, width=max(2 * margin, 0.02))
