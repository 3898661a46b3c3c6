"""What a failed forced run's stderr says about the algorithm (compare's FAILED rows)."""

import re

from collbench.engines.algorithms.discovery import MPICH_BAD_VALUE
from collbench.ops import DATATYPES, get_op

_MPI_CALL = re.compile(r"\b(MPI_[A-Z][a-z_]*)\(([^()]*)\) failed")


def _timed_call(call, args, step):
    """Whether MPICH's failing call is the step's own collective (same op and count)."""
    if step is None or call != get_op(step.op).mpi_function:
        return False
    m = re.search(r"\b(?:send)?count=(\d+)", args)
    if m is None:
        return True
    return int(m.group(1)) == step.size_bytes // DATATYPES.get(step.datatype, 1)


def failure_reason(stderr_tail, step=None):
    """What a failed forced run's stderr says about the algorithm ("" when it says nothing).

    MPICH names the failing call in its error stack; when that is not the step's own collective
    (the engine's bookkeeping: count=1 reductions, the plan broadcast), the algorithm was refused
    for that call, and the row says so rather than blaming the timed one.
    """
    text = stderr_tail or ""
    m = MPICH_BAD_VALUE.search(text)
    if m:
        return f"MPICH does not know {m.group(2)!r} for {m.group(1)}"
    call = _MPI_CALL.search(text)
    if "User set collective algorithm is not usable" in text:
        if call is None or _timed_call(call.group(1), call.group(2), step):
            return "MPICH: the algorithm cannot serve this call (MPIR_CVAR_COLLECTIVE_FALLBACK=error)"
        return (f"MPICH refuses the algorithm for the engine's own {call.group(1)}"
                f"({_short_args(call.group(2))}), so the timed calls could not run")
    if "MPI_ERR_UNSUPPORTED_OPERATION" in text or "operation not supported" in text:
        return "Open MPI: the algorithm does not support this call (MPI_ERR_UNSUPPORTED_OPERATION)"
    if call is not None and "Fatal error in" in text:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        stack = [ln for ln in lines if re.match(r"^MPI[RDI]?\w*\(\d+\)", ln)]
        where = stack[-1] if stack else lines[-1]
        return f"MPICH: {call.group(1)} failed under the forced algorithm ({' '.join(where.split())[:160]})"
    return ""


def _short_args(args):
    """The count, datatype and op of an MPI call's argument text (no buffer addresses)."""
    parts = [p.strip() for p in args.split(",")]
    keep = [p for p in parts if not re.match(r"^(?:send|recv)?buf(?:fer)?=", p)]
    return ", ".join(keep)[:120]
