#!/usr/bin/env python3
"""Stand-in for nccl-tests' <op>_perf binaries, for tests only (no GPU here).

tests/test_nccl_tests_engine.py launches these scripts with REAL mpirun (or directly, for
`launcher: none`) in place of nccl-tests. Invoked as all_reduce_perf etc. (a symlink), it takes
nccl-tests 2.19's options for what collbench passes (-b -e -f -g -n -w -d -c -o -r; an unknown one
gets nccl-tests' "invalid option" and usage, exit 1) and, on rank 0 only (an MPI=1 build prints
from rank 0), prints nccl-tests 2.19's text output: the version and "Collective test starting"
lines, the parameter line with the values passed, one device line per rank, the 13-column table
and the footer. Row figures come from a real published run (tests/fixtures/nccl_tests/
version_line_dstack.txt, all_reduce 8 B .. 2 GB): the time of the nearest size there, algbw and
busbw computed from it as nccl-tests does (src/<op>.cu GetBw).

Test hooks (environment):
  NCCL_STANDIN_MARK=FILE      every rank appends "<binary> <rank> <args>" to FILE
  NCCL_STANDIN_FAIL_AT=SIZE   print the rows below SIZE, then nccl-tests' failure lines as a real
                              run printed them (fixtures/nccl_tests/midtable_failure_nccl-tests-322.txt),
                              exit 3
  NCCL_STANDIN_WRONG=SIZE     that size's out-of-place #wrong is 1.04858e+06 (%6g of 1048576)
  NCCL_STANDIN_NOMPI=1        a binary built with MPI=0: each rank runs its own 1-rank job, and
                              mpirun's merged stdout is printed by rank 0 (so the interleave is
                              fixed): every run's lines down to its parameter line, then the rest
                              line by line in turn
  NCCL_STANDIN_HANG=1         print the header, then hang (bounded: 120 s)
  NCCL_STANDIN_PRINT=FILE     rank 0 prints FILE as it is (a published output from
                              tests/fixtures/nccl_tests) and exits with NCCL_STANDIN_RC (default 0)

NCCL's own settings, as NCCL 2.28 reads them (src/graph/tuning.cc, src/enqueue.cc):
  NCCL_ALGO / NCCL_PROTO      parsed as NCCL's parseList does ("Ring", "^LL128",
                              "allreduce:tree;allgather:ring", names case-insensitive); an unknown
                              name: NCCL's WARN "Unrecognized element token" and nccl-tests'
                              "invalid usage" failure at init; an enabled set the stand-in's tuner
                              gives no bandwidth (CollNet*, NVLS*: no NVSwitch, one node): NCCL's
                              WARN "No algorithm/protocol available" at the first call. The time
                              of a row is scaled per algorithm/protocol and size (SPEED below), so
                              a comparison has a known winner: Ring/LL at <= 64 KB (2x faster).
  NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS naming TUNING (or ALL): rank 0 prints NCCL's tuning
                              table (the INFO lines of ncclTopoTuneModel, their exact format).
"""

import contextlib
import io
import math
import os
import socket
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "fixtures" / "nccl_tests" / "version_line_dstack.txt"
TYPES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "half": 2, "float": 4,
         "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1}
# op -> (bus factor(n), data bytes printed is whole buffer?, has redop, has root)
OPS = {"all_reduce_perf": (lambda n: 2 * (n - 1) / n, True, False),
       "all_gather_perf": (lambda n: (n - 1) / n, False, False),
       "alltoall_perf": (lambda n: (n - 1) / n, False, False),
       "reduce_scatter_perf": (lambda n: (n - 1) / n, True, False),
       "broadcast_perf": (lambda n: 1.0, False, True),
       "reduce_perf": (lambda n: 1.0, True, True)}


NCCL_FUNCS = ["Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"]     # ncclFuncStr
NCCL_ALGOS = ["Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"]  # ncclAlgoStr
NCCL_PROTOS = ["LL", "LL128", "Simple"]                                              # ncclProtoStr
FUNC_OF = {"all_reduce_perf": "AllReduce", "all_gather_perf": "AllGather", "alltoall_perf": None,
           "reduce_scatter_perf": "ReduceScatter", "broadcast_perf": "Broadcast", "reduce_perf": "Reduce"}


def tuner_bw(func, algo, proto):
    """The stand-in tuner's bandwidth (0: NCCL disables it here: no NVSwitch, no CollNet, one node)."""
    if algo in ("CollNetDirect", "CollNetChain", "NVLS", "NVLSTree"):
        return 0.0
    if algo == "Tree" and func != "AllReduce":
        return 0.0
    if algo == "PAT" and (func not in ("AllGather", "ReduceScatter") or proto != "Simple"):
        return 0.0
    return {"LL": 12.0, "LL128": 90.0, "Simple": 120.0}[proto] * (0.8 if algo == "Tree" else 1.0)


def speed(algo, proto, size):
    """Time factor of a forced algorithm/protocol against NCCL's own choice (1.0)."""
    if algo == "Ring" and proto == "LL":
        return 0.5 if size <= 65536 else 3.0
    if algo == "Tree":
        return 1.4
    if proto == "LL128":
        return 1.2
    return 1.0


def parse_list(text, elems, enabled, host, pid):
    """NCCL's parseList: returns an error message (NCCL's WARN text) or None."""
    for i, token in enumerate(text.split(";")):
        if not token:
            continue
        prefix, _, elem_list = token.partition(":")
        if not _:
            if i:
                return f'All entries except the first must have a prefix: "{text}"'
            prefix, elem_list = None, token
        unset = elem_list.startswith("^")
        names = [e for e in elem_list.lstrip("^").split(",") if e]
        funcs = [f for f in NCCL_FUNCS if prefix is None or f.lower() == prefix.lower()]
        if not funcs:
            return f'Unrecognized prefix token "{prefix}" when parsing "{text}"'
        for f in funcs:
            for e in elems:
                enabled[(f, e)] = unset
            for n in names:
                match = [e for e in elems if e.lower() == n.lower()]
                if not match:
                    return f'Unrecognized element token "{n}" when parsing "{text}"'
                enabled[(f, match[0])] = not unset
    return None


def nccl_settings(host, pid):
    """({(func, algo): on}, {(func, proto): on}, error text or None) from NCCL_ALGO/NCCL_PROTO."""
    algos = {(f, a): True for f in NCCL_FUNCS for a in NCCL_ALGOS}
    protos = {(f, p): True for f in NCCL_FUNCS for p in NCCL_PROTOS}
    for var, elems, table in (("NCCL_PROTO", NCCL_PROTOS, protos), ("NCCL_ALGO", NCCL_ALGOS, algos)):
        if os.environ.get(var) is not None:
            err = parse_list(os.environ[var], elems, table, host, pid)
            if err:
                return algos, protos, err
    return algos, protos, None


def print_tuning(prefix):
    """ncclTopoTuneModel's INFO lines (tuning.cc), blocks of 3 algorithms."""
    for block in range(0, len(NCCL_ALGOS), 3):
        algos = NCCL_ALGOS[block:block + 3]
        line = "  Algorithm   |" + "".join(f" {'':>14s}   {a:>14s}   {'':>14s} |" for a in algos)
        print(prefix + line)
        print(prefix + "  Protocol    |" + "".join(f" {p:>14s} |" for _ in range(3) for p in NCCL_PROTOS))
        print(prefix + " Max NThreads |" + "".join(f" {512:14d} |" for _ in algos for _p in NCCL_PROTOS))
        for f in NCCL_FUNCS:
            print(prefix + f"{f:>13s} |" + "".join(f"{6.8:8.1f}/{tuner_bw(f, a, p):6.1f} |"
                                                   for a in algos for p in NCCL_PROTOS))


def source_times():
    times = {}
    for line in SOURCE.read_text().splitlines():
        f = line.split()
        if len(f) == 13 and f[0].isdigit():
            times[int(f[0])] = (float(f[5]), float(f[9]))
    return times


def size_arg(v):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(v[:-1]) * units[v[-1].upper()] if v[-1].upper() in units else int(v)


def fmt(v, width):
    for spec in (f"{width}.2f", f"{width}.1f", f"{width}.0f"):
        s = format(v, spec)
        if len(s) <= width:
            return s
    return format(v, f"{width}.1e")


def world():
    """(rank, ranks) as Open MPI or MPICH's launcher set them (0, 1 without one)."""
    return (int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))),
            int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1"))))


def main():
    name = os.path.basename(sys.argv[0])
    rank, nprocs = world()
    if os.environ.get("NCCL_STANDIN_MARK"):
        with open(os.environ["NCCL_STANDIN_MARK"], "a") as mark:
            mark.write(f"{name} {rank} {' '.join(sys.argv[1:])}\n")
    if os.environ.get("NCCL_STANDIN_NOMPI"):
        rank, nprocs = 0, 1
    opt = {"-b": "8", "-e": "33554432", "-f": "1", "-g": "1", "-n": "20", "-w": "1", "-d": "float",
           "-c": "1", "-o": "sum", "-r": "0"}
    args = sys.argv[1:]
    while args:
        a = args.pop(0)
        if a not in opt or not args:
            print(f"invalid option '{a.lstrip('-')[:1]}'")
            print(f"USAGE: {name} \n\t[-t,--nthreads <num threads>] \n\t[-g,--ngpus <gpus per thread>] ")
            return 1
        opt[a] = args.pop(0)
    if rank != 0:
        return 0
    if os.environ.get("NCCL_STANDIN_PRINT"):
        sys.stdout.write(Path(os.environ["NCCL_STANDIN_PRINT"]).read_text())
        sys.stdout.flush()
        return int(os.environ.get("NCCL_STANDIN_RC", "0"))
    factor, has_redop, has_root = OPS[name]
    lo, hi, f = size_arg(opt["-b"]), size_arg(opt["-e"]), int(opt["-f"])
    tsize = TYPES[opt["-d"]]
    validate = opt["-c"] != "0"
    host = socket.gethostname()
    print("# nccl-tests version 2.19.6 nccl-headers=22803 nccl-library=22803")
    print(f"# Collective test starting: {name}")
    print(f"# nThread 1 nGpus {opt['-g']} minBytes {lo} maxBytes {hi} step: {f}(factor) warmup iters: "
          f"{opt['-w']} iters: {opt['-n']} agg iters: 1 validation: {1 if validate else 0} graph: 0 unalign: 0")
    print("#\n# Using devices")
    for r in range(nprocs):
        print(f"#  Rank {r:2d} Group  0 Pid {os.getpid():6d} on {host:>10s} device {r:2d} [0000:{r:02x}:00] "
              f"NVIDIA H100 80GB HBM3 (stand-in)")
    func = FUNC_OF[name]
    info = f"{host}:{os.getpid()}:{os.getpid()} [0] NCCL INFO "
    debug = os.environ.get("NCCL_DEBUG", "").upper()
    subsys = os.environ.get("NCCL_DEBUG_SUBSYS", "").upper().split(",")
    if debug in ("INFO", "TRACE") and ("TUNING" in subsys or "ALL" in subsys):
        print_tuning(info)
    algos, protos, err = nccl_settings(host, os.getpid())
    warn = f"{host}:{os.getpid()}:{os.getpid()} [0] NCCL WARN "
    if err is None and func is not None and not any(
            algos[(func, a)] and protos[(func, p)] and tuner_bw(func, a, p) > 0
            for a in NCCL_ALGOS for p in NCCL_PROTOS):
        err = (f"No algorithm/protocol available for function {func} with datatype ncclFloat32."
               + (f" NCCL_ALGO was set to {os.environ['NCCL_ALGO']}." if "NCCL_ALGO" in os.environ else "")
               + (f" NCCL_PROTO was set to {os.environ['NCCL_PROTO']}." if "NCCL_PROTO" in os.environ else ""))
    if err:
        if debug in ("WARN", "INFO", "TRACE"):
            print(warn + err)
        print(f"{host}: Test NCCL failure common.cu:1204 'invalid usage (run with NCCL_DEBUG=WARN for details) / '")
        print(f" .. {host} pid {os.getpid()}: Test failure common.cu:915")
        sys.stdout.flush()
        return 3
    # the forced pair: NCCL picks among the enabled ones; one pair enabled is that pair
    on = [(a, p) for a in NCCL_ALGOS for p in NCCL_PROTOS
          if func and algos[(func, a)] and protos[(func, p)] and tuner_bw(func, a, p) > 0]
    forced = on[0] if len(on) == 1 else None
    print("#\n#                                                              out-of-place"
          "                       in-place          ")
    print("#       size         count      type   redop    root     time   algbw   busbw  #wrong"
          "     time   algbw   busbw  #wrong ")
    print("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
          "             (us)  (GB/s)  (GB/s)         ")
    sys.stdout.flush()
    if os.environ.get("NCCL_STANDIN_HANG"):
        time.sleep(120)
        return 1
    times = source_times()
    fail_at = int(os.environ.get("NCCL_STANDIN_FAIL_AT", "-1"))
    wrong_at = int(os.environ.get("NCCL_STANDIN_WRONG", "-1"))
    size, busbws = lo, []
    while size <= hi:
        if size == fail_at:
            print(f"{host}: Test NCCL failure common.cu:1204 'unhandled cuda error (run with "
                  f"NCCL_DEBUG=INFO for details) / '")
            print(f" .. {host} pid {os.getpid()}: Test failure common.cu:915")
            sys.stdout.flush()
            return 3
        near = min(times, key=lambda s: abs(math.log2(max(s, 1)) - math.log2(max(size, 1))))
        cols = [f"{size:12d}", f"{size // tsize:12d}", f"{opt['-d']:>8s}",
                f"{opt['-o'] if has_redop else 'none':>6s}", f"{int(opt['-r']) if has_root else -1:6d}"]
        for variant, t in (("oop", times[near][0]), ("ip", times[near][1])):
            t = t * (speed(forced[0], forced[1], size) if forced else 1.0)
            algbw = size / 1e9 / (t * 1e-6)
            busbw = algbw * factor(nprocs)
            busbws.append(busbw)
            wrong = "   N/A" if not validate else (
                f"{1048576:6g}" if variant == "oop" and size == wrong_at else f"{0:6g}")
            cols += [fmt(t, 7), fmt(algbw, 6), fmt(busbw, 6), wrong]
        print("  ".join(cols))
        sys.stdout.flush()
        size = size * f if f > 1 else size + 1 if lo == hi else size * 2
        if lo == hi:
            break
    bad = 1 if wrong_at >= 0 and validate and lo <= wrong_at <= hi else 0
    print(f"# {'Out of bounds values':<20s} : {bad} {'FAILED' if bad else 'OK'}")
    print(f"# {'Avg bus bandwidth':<20s} : {sum(busbws) / max(len(busbws), 1):g} ")
    print("#")
    print(f"# Collective test concluded: {name}")
    print("#")
    return 1 if bad else 0


def merged_independent_runs():
    """mpirun's stdout for nprocs ranks that each ran their own 1-rank job, interleaved as it was
    on a loaded CI machine: the second run's header split the first's from its device lines."""
    rank, nprocs = world()
    if rank != 0:
        return 0
    runs, rc = [], 0
    for _ in range(nprocs):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main() or rc
        runs.append(buf.getvalue().splitlines())
    heads = [next((i + 1 for i, line in enumerate(r) if "nThread" in line), 0) for r in runs]
    out = [line for r, h in zip(runs, heads) for line in r[:h]]
    tails = [r[h:] for r, h in zip(runs, heads)]
    for i in range(max(map(len, tails), default=0)):
        out += [t[i] for t in tails if i < len(t)]
    print("\n".join(out))
    return rc


if __name__ == "__main__":
    sys.exit(merged_independent_runs() if os.environ.get("NCCL_STANDIN_NOMPI") else main())
