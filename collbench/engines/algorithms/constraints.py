"""Why a forced algorithm cannot run as itself for a given number of ranks and elements, from the
libraries' source: such a row is reported (compare's SKIPPED), not measured under a wrong name.
"""

from collbench.engines import mpi_flavour
from collbench.engines.algorithms.discovery import canonical, is_default
from collbench.ops import get_op


def _is_pow2(n):
    return n > 0 and n & (n - 1) == 0


def known_constraint(flavour, op, name, nranks, count):
    """Why this algorithm cannot run as itself for nranks ranks and count elements ("" if it
    can), from the library's source: such a row is reported, not measured under a wrong name."""
    if is_default(name):
        return ""
    op, name = get_op(op).name, canonical(name)
    if flavour == mpi_flavour.MPICH:
        if op == "allgather" and name == "recursive_doubling" and not _is_pow2(nranks):
            # MPIR_Allgather_impl: MPII_COLLECTIVE_FALLBACK_CHECK(local_size == coll.pof2)
            return f"needs a power-of-two number of ranks (MPICH refuses it at {nranks})"
        return ""
    if flavour != mpi_flavour.OPENMPI:
        return ""
    if name == "two_proc" and nranks != 2:
        # coll_base_{allgather,alltoall,barrier}.c: *_two_procs returns MPI_ERR_UNSUPPORTED_OPERATION
        return f"needs exactly 2 ranks (Open MPI aborts with MPI_ERR_UNSUPPORTED_OPERATION at {nranks})"
    if op == "allgather" and name == "recursive_doubling" and not _is_pow2(nranks):
        # coll_base_allgather.c: non-power-of-two sizes switch to bruck
        return f"needs a power-of-two number of ranks (at {nranks} Open MPI runs bruck instead)"
    if op == "allgather" and name == "neighbor" and nranks % 2:
        # coll_base_allgather.c: odd sizes switch to ring
        return f"needs an even number of ranks (at {nranks} Open MPI runs ring instead)"
    if op == "allreduce" and name == "ring" and count < nranks:
        # coll_base_allreduce.c: count < comm size switches to recursive doubling
        return (f"needs at least one element per rank ({count} < {nranks}: Open MPI runs "
                f"recursive_doubling instead)")
    return ""
