#!/usr/bin/env python3
"""Stand-in for OSU's osu_<op> binaries, for tests only.

OSU Micro-Benchmarks cannot be built here (its source is in no reachable package registry), so
tests/test_osu_engine.py and tests/test_once.py launch these scripts with REAL mpirun in its
place. Invoked as osu_<op> (a symlink), it accepts OSU 7.4's option spellings for what collbench
passes (-m MIN:MAX, -i, -x, -f, -c, -T, -M, -h, -v) and, on rank 0 only (OSU prints from rank 0),
prints the captured OSU 7.4 output for that op (tests/fixtures/osu-7.4/<op>_np2[_full].txt)
filtered to the requested size range: -i rewrites the Iterations column (OSU prints the -i
value), -T relabels the datatype block and drops sizes below one element (the figures stay the
MPI_CHAR run's), -c appends OSU's Validation column. Like OSU it needs >= 2 ranks and answers
an unknown option with "Invalid option [-q]" on stderr, its usage text on stdout, exit 1.

Test hooks (environment; lists are op names):
  OSU_STANDIN_MARK=FILE        every rank appends "<op> <rank> <args>" to FILE (proves a run happened)
  OSU_STANDIN_REJECT=T         reject -T as an invalid option (as OSU 5.x does)
  OSU_STANDIN_FAIL=bcast       rank 0 of that op reports an error on stderr and exits 3
  OSU_STANDIN_HANG=bcast       that op prints its header, then hangs (bounded: 120 s)
  OSU_STANDIN_BADVALID=reduce  with -c, that op's row says Fail and OSU's error line follows
"""

import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FIXTURE_DIRS = [Path(os.environ["OSU_STANDIN_FIXTURES"])] if os.environ.get("OSU_STANDIN_FIXTURES") else [
    REPO / "tests" / "fixtures" / "osu-7.4"]
TYPE_SIZES = {"MPI_CHAR": 1, "MPI_INT": 4, "MPI_FLOAT": 4}
FW = 18


def usage(name):
    return (f"Usage: {name} [options]\nOptions:\n"
            "  -h, --help                print this help\n"
            "  -v, --version             print version info\n"
            "  -f, --full                print full format listing (MIN/MAX latency and ITERATIONS\n"
            "  -m, --message-size        [MIN:]MAX - set the minimum and/or the maximum message size to MIN and/or MAX\n"
            "  -i, --iterations          ITER - number of iterations for timing (default 10000)\n"
            "  -x, --warmup              ITER - set number of warmup\n")


def bad_usage(name, message, rank):
    if rank == 0:
        sys.stderr.write(f"{message}\n\n")
        sys.stdout.write(usage(name))
    sys.exit(1)


def in_list(var, op):
    return op in [x.strip() for x in os.environ.get(var, "").split(",")]


def main():
    name = os.path.basename(sys.argv[0])
    op = name[len("osu_"):]
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    nprocs = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    args = sys.argv[1:]
    if os.environ.get("OSU_STANDIN_MARK"):
        with open(os.environ["OSU_STANDIN_MARK"], "a") as mark:
            mark.write(f"{op} {rank} {' '.join(args)}\n")
    lo, hi, iters, full, validate, dtype = 1, 1 << 20, None, False, False, "MPI_CHAR"
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-m", "-i", "-x", "-T", "-M"):
            if i + 1 >= len(args):
                bad_usage(name, f"Option Missing Required Argument [{a}]", rank)
            val = args[i + 1]
            i += 2
            if a == "-m":
                m = re.fullmatch(r"(\d+):(\d+)", val)
                if not m:
                    bad_usage(name, f"Invalid Message Size [-m {val}]", rank)
                lo, hi = int(m.group(1)), int(m.group(2))
            elif a == "-i":
                iters = int(val)
            elif a == "-T":
                dtype = val.upper()
                if dtype not in TYPE_SIZES or op == "barrier" or os.environ.get("OSU_STANDIN_REJECT") == "T":
                    bad_usage(name, "Invalid option [-T]", rank)
            continue
        if a == "-f":
            full = True
        elif a == "-c" and op != "barrier":
            validate = True
        elif a == "-h":
            if rank == 0:
                sys.stdout.write(usage(name))
            return 0
        elif a == "-v":
            if rank == 0:
                sys.stdout.write(f"# OSU MPI {op} v7.4 (stand-in)\n")
            return 0
        else:
            bad_usage(name, f"Invalid option [{a}]", rank)
        i += 1
    if nprocs < 2:
        if rank == 0:
            sys.stderr.write("This test requires at least two processes\n")
        return 1
    if rank != 0:
        return 0
    if in_list("OSU_STANDIN_FAIL", op):
        sys.stderr.write(f"[standin] {name}: simulated rank failure\n")
        return 3
    src = next(d / f"{op}_np2{'_full' if full else ''}.txt" for d in FIXTURE_DIRS
               if (d / f"{op}_np2.txt").is_file())
    bad_valid = validate and in_list("OSU_STANDIN_BADVALID", op)
    for line in src.read_text().splitlines():
        if line.startswith("# Datatype:"):
            print(f"# Datatype: {dtype}.")
        elif line.startswith(("# Size", "# Avg")):
            print(line + (f"{'Validation':>{FW}}" if validate else ""))
        elif re.match(r"^\s*\d", line):
            fields = line.split()
            if op != "barrier":
                size = int(fields[0])
                if not (lo <= size <= hi) or size < TYPE_SIZES[dtype]:
                    continue
            if full and iters is not None:
                line = line[:-12] + f"{iters:>12}"  # OSU prints Iterations as %12lu, last
            print(line + (f"{'Fail' if bad_valid else 'Pass':>{FW}}" if validate else ""))
        else:
            print(line)
        sys.stdout.flush()
        if in_list("OSU_STANDIN_HANG", op) and line.startswith("# Size"):
            time.sleep(120)
            return 1
    if bad_valid:
        print(f"DATA VALIDATION ERROR: {sys.argv[0]} exited with status 1 on message size {hi}.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
