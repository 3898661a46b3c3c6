"""The env file `compare --engine nccl-tests --write-rules` writes: NCCL_ALGO / NCCL_PROTO per
collective, in NCCL's own per-function syntax (src/graph/tuning.cc parseList):

    NCCL_ALGO=allreduce:Ring;allgather:PAT
    NCCL_PROTO=allreduce:LL

A prefixed entry sets that function's list only; the functions it does not name keep every
algorithm/protocol, so NCCL's own choice stays theirs. (NCCLs without the per-function syntax,
before 2.24, reject a prefix with "Unrecognized element token": there one op's setting can only
be given for every op.) One setting per op holds for every size: per-size choices need a tuner
plugin. Use: `set -a; . FILE; set +a` before the job, or the lines in a config's `env`.
"""

from collbench.bounded_file import read_settings
from collbench.compare.nccl_candidates import FUNCS

MAX_BYTES = 1 << 20


def variables(choices):
    """{NCCL_ALGO: ..., NCCL_PROTO: ...} for choices {op: (Candidate or None, sizes)}."""
    algo = [f"{op}:{c.algo}" for op, (c, _) in choices.items() if c is not None]
    proto = [f"{op}:{c.proto}" for op, (c, _) in choices.items() if c is not None and c.proto]
    out = {}
    if algo:
        out["NCCL_ALGO"] = ";".join(algo)
    if proto:
        out["NCCL_PROTO"] = ";".join(proto)
    return out


def render(choices, header=()):
    lines = [f"# {h}" for h in header]
    lines.append("# Use: set -a; . THIS_FILE; set +a   (or these lines in a collbench config's env)")
    for op, (c, sizes) in choices.items():
        what = f"{c.name} (NCCL_ALGO={c.algo}" + (f", NCCL_PROTO={c.proto})" if c.proto else ")") if c else \
            "NCCL's own choice: no setting proven faster at every size"
        lines.append(f"# {op} ({FUNCS.get(op, op)}): {what}")
    for name, value in variables(choices).items():
        lines.append(f"{name}={value}")
    return "\n".join(lines) + "\n"


def read(path):
    """{NCCL_ALGO/NCCL_PROTO: value} of an env file written by render(); UserError naming the line."""
    return read_settings(path, "NCCL_ALGO|NCCL_PROTO", f"--check-rules {path}",
                         "NCCL_ALGO=... or NCCL_PROTO=... lines (NCCL's names and per-function syntax)",
                         value=r"[A-Za-z0-9:;,^_]{1,1024}", max_bytes=MAX_BYTES)
