"""Which collective a nccl-tests / rccl-tests output measured, when only the binary the user ran knew.

In order, the first that answers:
1. the output names it: `# Collective test starting/concluded: all_gather_perf`, -J's args,
   rccl-tests' JSON `name`; or a command line or banner in the paste (`$ ./build/all_reduce_perf
   -b 8`, `======== scatter_perf ========`), unless the table (step 2) rules it out and names
   another op alone (a paste's command line may belong to a neighbouring run);
2. the table itself: its column set and row values (a reduction's `redop` is sum/prod/...; others
   print `none`, hypercube prints nothing; rooted ops print a root >= 0, the rest -1; before 2.13
   only reductions had a `redop` column and only bcast/reduce a `root` one), and the ratios
   nccl-tests' getBw functions fix: busbw/algbw (2(n-1)/n allreduce; (n-1)/n allgather,
   reduce_scatter, alltoall(v), scatter, gather; 1 bcast, reduce, sendrecv, hypercube) and
   algbw x time / size (1, but (n-1)/n for hypercube), against the rank count when it is known,
   or solved for it when it is not;
3. the file's name (`all_gather_perf.log`).
Two or more ops left: ambiguous (the caller asks for --op, naming them).
"""

import os
from dataclasses import dataclass, field

from collbench.ops import ALL_OPS

# nccl-tests binary -> our op
OP_OF_BINARY = {op.nccl_tests_binary: op.name for op in ALL_OPS.values() if op.nccl_tests_binary}
REDUCTIONS = ("sum", "prod", "max", "min", "avg", "mulsum", "premulsum")
MAX_RANKS = 4096       # the rank counts tried when solving the ratios for n
# algbw x time / size at n ranks where it is not 1 (nccl-tests src/hypercube.cu: S = count x (n-1))
RATIO_ALG = {"hypercube": lambda n: (n - 1) / n}


def _bus_ratio(op, n):
    """busbw / algbw at n ranks: the op table's bus factor (nccl-tests' GetBw)."""
    return ALL_OPS[op].bus_factor(n)


def _alg_ratio(op, n):
    return RATIO_ALG[op](n) if op in RATIO_ALG else 1.0


def op_of_test(name):
    """Our op for a nccl-tests program name ('all_reduce_perf', '/x/alltoall_perf_mpi'), or None."""
    if not name:
        return None
    base = os.path.basename(str(name))
    if base.endswith("_mpi"):
        base = base[:-4]
    return OP_OF_BINARY.get(base)


def op_of_file_name(path):
    """The op a file's name gives away ('all_gather_perf.log', 'rccl_alltoall_2n.txt'), or None."""
    base = os.path.basename(str(path)).lower().replace("-", "_")
    squashed = base.replace("_", "")
    for binary, op in sorted(OP_OF_BINARY.items(), key=lambda kv: -len(kv[0])):
        stem = binary[: -len("_perf")]
        if stem in base or stem.replace("_", "") in squashed:
            return op
    return None


@dataclass
class Inference:
    op: str = None               # None: not inferred
    how: str = ""                # what decided it, for the summary
    candidates: list = field(default_factory=list)   # the ops left when ambiguous
    ranks: int = None            # the rank count the ratios fix when the output lacks it
    ranks_how: str = ""


def _ratios(rows):
    """(busbw/algbw, algbw x time / size, their tolerances) of the row whose figures are the most
    precise (the largest algbw), or None. Bandwidths are printed with 2 decimals, times with 2, 1
    or 0 (at least 4 significant digits)."""
    best = None
    for r in rows:
        v = r.oop or r.ip
        if v is None or v.algbw_gbs <= 0 or v.time_us <= 0 or r.size <= 0:
            continue
        if best is None or v.algbw_gbs > best[0]:
            best = (v.algbw_gbs, v.busbw_gbs, v.time_us, r.size)
    if best is None:
        return None
    algbw, busbw, time_us, size = best
    bus, alg = busbw / algbw, algbw * 1e3 * time_us / size
    tol_bus = bus * (0.0051 / algbw + (0.0051 / busbw if busbw > 0 else 0)) + 1e-3
    tol_alg = alg * (0.0051 / algbw + max(0.0051, time_us * 5.1e-4) / time_us) + 1e-3
    return bus, alg, tol_bus, tol_alg


# before 2020-06-19 (nccl-tests ec1b5e2, "Change all_gather/reduce_scatter algbw to match the
# documentation") these two folded (n-1)/n into algbw and printed busbw = algbw
BEFORE_2020_06 = {"allgather": (lambda n: 1.0, lambda n: (n - 1) / n),
                  "reduce_scatter": (lambda n: 1.0, lambda n: (n - 1) / n)}


def _fits(op, n, ratios, old=False):
    """Do the ratios fit `op` at n ranks (old: a pre-2.13 table, which may predate 2020-06)?"""
    bus, alg, tol_bus, tol_alg = ratios
    if _close(bus, _bus_ratio(op, n), tol_bus) and _close(alg, _alg_ratio(op, n), tol_alg):
        return True
    if old and op in BEFORE_2020_06:
        b, a = BEFORE_2020_06[op]
        return _close(bus, b(n), tol_bus) and _close(alg, a(n), tol_alg)
    return False


def _old_table(out):
    return not ("redop" in out.columns and "root" in out.columns)


def _close(observed, expected, tol):
    return abs(observed - expected) <= tol


# each op's (redop printed, rooted) in the 2.13+ table, and (redop column, root column) before 2.13
MODERN_SIGNATURE = {"allreduce": ("reduction", False), "reduce_scatter": ("reduction", False),
                    "reduce": ("reduction", True), "sendrecv": ("reduction", False),
                    "bcast": ("none", True), "scatter": ("none", True), "gather": ("none", True),
                    "allgather": ("none", False), "alltoall": ("none", False), "alltoallv": ("none", False),
                    "hypercube": ("empty", False)}
OLD_COLUMNS = {"allreduce": (True, False), "reduce_scatter": (True, False), "reduce": (True, True),
               "bcast": (False, True), "scatter": (False, True), "gather": (False, True),
               "allgather": (False, False), "alltoall": (False, False), "alltoallv": (False, False),
               "sendrecv": (False, False)}


# the tests that never check their in-place result (reportErrors = in_place ? 0 : 1): their
# in-place #wrong is N/A where the out-of-place one is a number
IN_PLACE_UNCHECKED = ("sendrecv", "alltoall", "alltoallv")


def _in_place_checked(rows):
    """True: both variants carry a #wrong; False: only the out-of-place one; None: no telling."""
    seen = {(r.oop.wrong is not None, r.ip.wrong is not None) for r in rows[:1000] if r.oop and r.ip}
    if seen == {(True, True)}:
        return True
    if seen == {(True, False)}:
        return False
    return None


def _table_candidates(out):
    """The ops the table's columns and row values allow, and what they were."""
    ops, said = _column_candidates(out)
    checked = _in_place_checked(out.rows)
    if checked is not None:
        ops = [op for op in ops if (op in IN_PLACE_UNCHECKED) != checked]
        said.append("in-place #wrong " + ("checked" if checked else "N/A (never checked)"))
    return ops, said


def _column_candidates(out):
    cols = set(out.columns)
    if "redop" in cols and "root" in cols:       # 2.13+ (and pre-2019 reduce): values decide
        redops = {r.redop for r in out.rows[:1000]}
        roots = {r.root for r in out.rows[:1000]}
        kind = "empty" if redops == {""} else "none" if redops == {"none"} else \
            "reduction" if redops and redops <= set(REDUCTIONS) else None
        rooted = True if roots and min(roots) >= 0 else False if roots == {-1} else None
        ops = [op for op, (k, r) in MODERN_SIGNATURE.items()
               if (kind is None or k == kind) and (rooted is None or r == rooted)]
        said = [f"redop {sorted(redops)[0] or 'empty'!s}" if kind else "mixed redops",
                f"root {'>= 0' if rooted else '-1'}" if rooted is not None else "mixed roots"]
        return ops, said
    has = ("redop" in cols, "root" in cols)
    ops = [op for op, c in OLD_COLUMNS.items() if c == has]
    said = [f"columns {' '.join(out.columns)} (before 2.13: "
            + ("a reduction" if has[0] else "not a reduction") + (", rooted)" if has[1] else ")")]
    return ops, said


def infer_from_table(out, ranks=None):
    """Inference from the table alone (step 2 of the module docstring)."""
    if not out.rows:
        return Inference()
    ops, said = _table_candidates(out)
    ratios = _ratios(out.rows)
    if ratios is None:
        return Inference(candidates=ops, how=", ".join(said))
    bus, alg = ratios[:2]
    old = _old_table(out)
    left = [op for op in ops if (_fits(op, ranks, ratios, old) if ranks else
                                 any(_fits(op, n, ratios, old) for n in range(1, MAX_RANKS + 1)))]
    said.append(f"busbw/algbw {bus:.3f}" + (f" at {ranks} ranks" if ranks else ""))
    if "hypercube" in ops or old:
        said.append(f"algbw x time / size {alg:.3f}")
    inf = Inference(candidates=left, how=", ".join(said))
    if len(left) == 1:
        inf.op = left[0]
        if not ranks:
            inf.ranks, inf.ranks_how = ranks_for(out, left[0])
    return inf


def ranks_for(out, op):
    """(n, how) when the table's ratios fix the rank count of a run of `op` to one value, else (None, "")."""
    ratios = _ratios(out.rows)
    if ratios is None or op not in OP_OF_BINARY.values():
        return None, ""
    bus, alg = ratios[:2]
    ns = [n for n in range(1, MAX_RANKS + 1) if _fits(op, n, ratios, _old_table(out))]
    if len(ns) != 1:
        return None, ""
    if op in RATIO_ALG:
        return ns[0], f"{ns[0]} ranks from algbw x time / size {alg:.3f} ((n-1)/n of {op})"
    return ns[0], f"{ns[0]} ranks from busbw/algbw {bus:.3f} ({ALL_OPS[op].bus_factor_formula} of {op})"


def infer(out, path, ranks=None):
    """The op of one Output: an Inference whose `how` says what decided it. The test's own
    name (Collective test starting, -J args, rccl-tests' name) is taken as said; a command line
    in a paste is weaker (it may belong to a neighbouring run): it is taken unless the table
    rules it out and names another op alone."""
    op = op_of_test(out.test)
    if op:
        return Inference(op=op, how=f"the output names its test ({os.path.basename(str(out.test))[:60]})")
    table = infer_from_table(out, ranks)
    op = op_of_test(out.command_test)
    if op:
        named = os.path.basename(str(out.command_test))[:60]
        if table.op and table.op != op:
            table.how = f"inferred from the table: {table.how} (the command line before it ran {named}, " \
                        f"which the table rules out)"
            return table
        return Inference(op=op, how=f"the command line in it ({named})")
    if table.op:
        table.how = f"inferred from the table: {table.how}"
        return table
    op = op_of_file_name(path)
    if op and (not table.candidates or op in table.candidates):
        return Inference(op=op, how="the file's name", ranks=table.ranks, ranks_how=table.ranks_how)
    return table
