"""The tuning file `collbench compare --write-rules` hands back, and its reader for --check-rules.

Open MPI: a coll/tuned dynamic rules file in the classic format that Open MPI 4.1 reads
(ompi/mca/coll/tuned/coll_tuned_dynamic_file.c, ompi_coll_tuned_read_rules_config_file), loaded
with `--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_dynamic_rules_filename FILE`:

    <number of collectives>
    per collective: <collective id>  <number of communicator sizes>
      per communicator size: <comm size>  <number of message-size rules>
        per rule: <message size> <algorithm id> <fan in/out> <segment size>

Numbers are read with fscanf("%li"); '#' starts a comment to the end of the line. The
collective id is Open MPI's COLLTYPE enum (ompi/mca/coll/base/coll_base_functions.h: ALLGATHER=0,
ALLGATHERV=1, ALLREDUCE=2, ALLTOALL=3, ALLTOALLV=4, ALLTOALLW=5, BARRIER=6, BCAST=7, EXSCAN=8,
GATHER=9, GATHERV=10, REDUCE=11, REDUCESCATTER=12, ...). A communicator uses the entry with the
largest comm size <= its own (the first entry when none is); a call uses the rule with the
largest message size <= its own, so the first rule must start at 0. Algorithm 0 falls back to
the library's own (fixed) decision. The message size is the one coll/tuned computes: the
datatype size times the count for allreduce, bcast and reduce, times the count and the
communicator size for allgather and alltoall, the whole send buffer for reduce_scatter:
collbench's size for the first group and reduce_scatter, size x ranks for allgather and alltoall
(ops.Op.data_bytes).

MPICH: an environment file of MPIR_CVAR_<OP>_INTRA_ALGORITHM settings. A CVAR forces one
algorithm for every size, so the file names, per op, the one algorithm chosen for all sizes
(compare/stats.py: proven at some size, never proven slower by more than the margin at any);
size-dependent selection needs MPICH's JSON tuning file (MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE,
see docs/ALGORITHMS.md).
"""

import math
import re
from dataclasses import dataclass

from collbench.errors import UserError
from collbench.ops import get_op
from collbench.sizes import format_size

# Open MPI's COLLTYPE ids of the ops in collbench's table (coll_base_functions.h).
OMPI_COLLTYPE = {"allgather": 0, "allreduce": 2, "alltoall": 3, "barrier": 6, "bcast": 7,
                 "reduce": 11, "reduce_scatter": 12}
COLLCOUNT = 22                 # coll_base_functions.h: COLLTYPE's end marker in 4.1
MAX_RULES_FILE = 1 << 20
LONG_MAX = (1 << 63) - 1       # fscanf("%li") on a 64-bit long: a larger number is out of range


@dataclass(frozen=True)
class Choice:
    """The algorithm to use from one measured size up."""
    size_bytes: int            # collbench's size (bytes per rank)
    name: str                  # algorithm name, or "default"
    value: str                 # what selects it: Open MPI's id ("0" for the default), MPICH's name


def ompi_message_size(op_name, size_bytes, nranks):
    """The message size coll/tuned looks rules up by, for one collbench size."""
    op = get_op(op_name)
    return op.data_bytes(size_bytes, nranks) if op.has_size else 0


def ompi_rules_for_op(op_name, choices, nranks):
    """[(message size from, algorithm id, name, collbench size)] for one op: a rule starts
    halfway (geometrically) between two measured sizes; neighbours with one algorithm merge."""
    choices = sorted(choices, key=lambda c: c.size_bytes)
    rules = []
    previous_msg = None
    for c in choices:
        msg = ompi_message_size(op_name, c.size_bytes, nranks)
        start = 0 if previous_msg is None else int(math.sqrt(previous_msg * msg)) + 1
        previous_msg = msg
        if rules and rules[-1][1] == c.value:
            continue
        rules.append((start, c.value, c.name, c.size_bytes))
    if rules:
        rules[0] = (0,) + rules[0][1:]
    return rules


def render_ompi_rules(per_op, nranks, header=()):
    """The rules file text: per op in per_op ({op: [Choice]}), rules for communicators of
    nranks ranks; communicators of other sizes keep the library's own decision."""
    ops = [op for op in per_op if per_op[op]]
    lines = [f"# {h}" for h in header]
    lines += ["# Load with: --mca coll_tuned_use_dynamic_rules 1 "
              "--mca coll_tuned_dynamic_rules_filename THIS_FILE",
              f"{len(ops):<12d}# collectives with rules"]
    for op in sorted(ops, key=lambda o: OMPI_COLLTYPE[o]):
        rules = ompi_rules_for_op(op, per_op[op], nranks)
        sizes = [1, nranks, nranks + 1] if nranks > 1 else [1, 2]
        lines += [f"{OMPI_COLLTYPE[op]:<12d}# {op}",
                  f"{len(sizes):<12d}# communicator sizes"]
        for comm in sizes:
            if comm == nranks:
                lines += [f"{comm:<12d}# communicators of {nranks} ranks: measured",
                          f"{len(rules):<12d}# message-size rules"]
                for start, value, name, size in rules:
                    lines.append(f"{start} {value} 0 0".ljust(24) +
                                 f"# from {start} B (size {format_size(size)} measured): {name}")
            else:
                what = "smaller" if comm < nranks else "larger"
                lines += [f"{comm:<12d}# {what} communicators: the library's own decision",
                          f"{1:<12d}# message-size rules",
                          "0 0 0 0".ljust(24) + "# algorithm 0: fixed decision"]
    return "\n".join(lines) + "\n"


def _numbers(text, path):
    """The numbers of a classic rules file, as Open MPI's reader sees them ('#' comments out)."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0]
        for tok in line.split():
            if not re.fullmatch(r"[0-9]+", tok):
                raise UserError(f"{path}: line {n}: {tok[:40]!r} is not a whole number "
                                f"(expected the classic coll/tuned rules format)")
            digits = tok.lstrip("0") or "0"
            if len(digits) > 19 or int(digits) > LONG_MAX:
                shown = tok if len(tok) <= 24 else f"{tok[:12]}...({len(tok)} digits)"
                raise UserError(f"{path}: line {n}: {shown} is out of range (Open MPI reads a long: "
                                f"at most {LONG_MAX})")
            out.append((int(digits), n))
    return out


def parse_ompi_rules(text, path="rules file", algorithm_ids=None):
    """{collective id: [(comm size, [(message size, algorithm, faninout, segsize)])]} from a
    classic rules file; UserError naming the file and line for what Open MPI would refuse.

    algorithm_ids: {collective id: {valid algorithm ids}} (the installed MPI's list, 0 always
    valid): an algorithm outside it is refused naming the line (Open MPI would accept the file
    and fail inside the job)."""
    nums = _numbers(text, path)
    pos = 0

    def take(what):
        nonlocal pos
        if pos >= len(nums):
            raise UserError(f"{path}: ends where {what} was expected")
        pos += 1
        return nums[pos - 1]

    ncol, line = take("the number of collectives")
    if ncol > COLLCOUNT:
        raise UserError(f"{path}: line {line}: {ncol} collectives, more than Open MPI has ({COLLCOUNT})")
    out = {}
    for _ in range(ncol):
        cid, line = take("a collective id")
        if cid >= COLLCOUNT:
            raise UserError(f"{path}: line {line}: collective id {cid} is not one of Open MPI's (0-{COLLCOUNT - 1})")
        ncomm, _ = take("the number of communicator sizes")
        comms = []
        for _ in range(ncomm):
            comm, _ = take("a communicator size")
            nmsg, _ = take("the number of message-size rules")
            rules = []
            for i in range(nmsg):
                msg, line = take("a message size")
                alg, _ = take("an algorithm id")
                fan, _ = take("a fan in/out")
                seg, _ = take("a segment size")
                if i == 0 and msg != 0:
                    raise UserError(f"{path}: line {line}: the first message-size rule must start at 0 "
                                    f"(Open MPI ignores the whole file otherwise)")
                if rules and msg <= rules[-1][0]:
                    raise UserError(f"{path}: line {line}: message sizes must increase")
                valid = (algorithm_ids or {}).get(cid)
                if valid is not None and alg != 0 and alg not in valid:
                    raise UserError(f"{path}: line {line}: algorithm {alg} is not one of this MPI's for "
                                    f"collective {cid} (0, {', '.join(str(v) for v in sorted(valid))})")
                rules.append((msg, alg, fan, seg))
            comms.append((comm, rules))
        out[cid] = comms
    if pos != len(nums):
        raise UserError(f"{path}: line {nums[pos][1]}: numbers after the last collective's rules")
    return out


def read_ompi_rules(path, algorithm_ids=None):
    """parse_ompi_rules of a file (UserError if unreadable or malformed)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_RULES_FILE + 1)
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read the rules file: {e}") from None
    if len(text) > MAX_RULES_FILE:
        raise UserError(f"{path}: over {MAX_RULES_FILE >> 10} KB: not a rules file")
    return parse_ompi_rules(text, path, algorithm_ids)


def catalogue_ids(cat):
    """{collective id: {algorithm ids}} of an Open MPI catalogue, for parse_ompi_rules."""
    out = {}
    for op, cid in OMPI_COLLTYPE.items():
        ids = set()
        for name in cat.names(op):
            value = cat.find(op, name).value
            if value.isdigit():
                ids.add(int(value))
        if ids:
            out[cid] = ids
    return out


def rule_for(rules, coll_id, comm_size, msg_size):
    """The algorithm id Open MPI 4.1 would pick from parsed rules (0: its own decision)."""
    comms = rules.get(coll_id)
    if not comms:
        return 0
    best = comms[0]
    for comm in comms:
        if comm[0] <= comm_size:
            best = comm
        else:
            break
    alg = 0
    for msg, a, _, _ in best[1]:
        if msg <= msg_size:
            alg = a
        else:
            break
    return alg


def mpich_choice(choices):
    """The one algorithm for all sizes: the one fastest at the most sizes (ties: the larger sizes)."""
    wins = {}
    for rank, c in enumerate(sorted(choices, key=lambda c: c.size_bytes)):
        count, last = wins.get(c.name, (0, -1))
        wins[c.name] = (count + 1, rank)
    return max(wins.items(), key=lambda kv: kv[1])[0] if wins else None


def render_mpich_env(per_op, infix, header=()):
    """An env file (`NAME=value` lines) forcing per op the algorithm mpich_choice picks."""
    lines = [f"# {h}" for h in header]
    lines.append("# Use: set -a; . THIS_FILE; set +a   (or mpiexec -genv NAME VALUE per line)")
    forced = False
    for op in per_op:
        choices = per_op[op]
        name = mpich_choice(choices)
        wins = ", ".join(f"{format_size(c.size_bytes)} {c.name}" for c in sorted(choices, key=lambda c: c.size_bytes))
        lines.append(f"# {op}: chosen per size: {wins}")
        if name is None or name == "default":
            lines.append(f"# {op}: no algorithm proven faster at every size: the library's own choice, nothing to set")
            continue
        forced = True
        lines.append(f"MPIR_CVAR_{infix[op]}_INTRA_ALGORITHM={name}")
    if forced:
        lines.append("# the ch4 device would otherwise choose its own algorithms over these")
        lines.append("MPIR_CVAR_DEVICE_COLLECTIVES=none")
    return "\n".join(lines) + "\n"
