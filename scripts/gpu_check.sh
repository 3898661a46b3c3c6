#!/usr/bin/env bash
# GPU check: build NVIDIA's nccl-tests against the NCCL and CUDA found here, then run
# `collbench once --engine nccl-tests` (a few ops, small sizes) on the GPUs this machine has,
# printing nccl-tests' own output, collbench's table and the records, then a short
# `compare --engine nccl-tests` (NCCL's algorithms/protocols, allreduce, 3 sizes) and
# `nccl replay --engine nccl-tests` of tests/fixtures/nccl/gpu-replay-tiny.log. Not part of the CPU test
# suite (no GPU there); see docs/GPU.md.
#
# usage: scripts/gpu_check.sh [NCCL_TESTS_SRC]     (default: $NCCL_TESTS_SRC, else .gpu/nccl-tests)
#        scripts/gpu_check.sh --bin DIR            (use nccl-tests binaries already built in DIR)
#
# Finds, in this order:
#   CUDA   nvcc on PATH, $CUDA_HOME/bin/nvcc, /usr/local/cuda[-*]/bin/nvcc, or the CUDA 13 wheels
#          (nvidia-cuda-nvcc, -crt, -runtime, -cccl, nvidia-nvvm in one site-packages: nvidia/cu13/);
#          libcudart from the toolkit's lib64/lib or the nvidia-cuda-runtime(-cu12) wheel
#   NCCL   $NCCL_HOME, else the nvidia-nccl-cu12 / -cu13 wheel in python3's site-packages
#   MPI    mpicc + mpirun (Open MPI or MPICH): MPI=1, one rank per GPU through mpirun;
#          none: MPI=0 and `launcher: none`, one process on one GPU
# Environment: PYTHON (default python3; the collbench venv is not needed: PYTHONPATH=repo),
#   GPU_CHECK_WORK (default .gpu/work), GPU_CHECK_JOBS (make -j, default nproc), OUT (copies of the
#   outputs go there when set), GPU_CHECK_MPI=0 (build and run without MPI even when one is
#   installed), GPU_CHECK_GPUS (the GPU count, only to try the script on stand-ins:
#   GPU_CHECK_GPUS=2 scripts/gpu_check.sh --bin tests/nccl_tests_standin), GPU_CHECK_BLOCKS (compare's
#   blocks, default 5: fewer cannot prove a choice at 95 %), GPU_CHECK_INSPECTOR_SRC (an NVIDIA/nccl
#   checkout's Inspector plugin folder: build it, run all_reduce_perf with it, import and serve its
#   files; unset: that part is skipped and says so).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="${GPU_CHECK_WORK:-$REPO/.gpu/work}"
JOBS="${GPU_CHECK_JOBS:-$(nproc 2>/dev/null || echo 4)}"
BIN=""
SRC=""
if [ "${1:-}" = "--bin" ]; then
    BIN="$(cd "${2:?--bin needs a directory}" && pwd)"
else
    SRC="${1:-${NCCL_TESTS_SRC:-$REPO/.gpu/nccl-tests}}"
fi
mkdir -p "$WORK"
T0=$(date +%s)

say() { printf '\n=== %s (%ss)\n' "$*" "$(( $(date +%s) - T0 ))"; }
die() { printf 'gpu_check: %s\n' "$*" >&2; exit 2; }

# ---------------------------------------------------------------- what is here
say "machine"
uname -a
GPUS=0
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,memory.total,compute_cap,driver_version --format=csv,noheader || true
    GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
GPUS="${GPU_CHECK_GPUS:-$GPUS}"   # GPU_CHECK_GPUS: only to try this script with stand-in binaries (--bin)
[ "$GPUS" -ge 1 ] || die "no NVIDIA GPU found (nvidia-smi -L lists none)"
echo "GPUs: $GPUS"
"$PYTHON" -c 'import sys, yaml; print("python", sys.version.split()[0], "PyYAML", yaml.__version__)' \
    || die "$PYTHON cannot import yaml (PyYAML): collbench reads its config with it"

# the wheel's files: the first path under python's nvidia/ packages matching a pattern
wheel_file() {
    "$PYTHON" - "$1" <<'EOF'
import fnmatch, os, sys
try:
    import nvidia
except ImportError:
    sys.exit(0)
for root in list(nvidia.__path__):
    for d, _, files in os.walk(root):
        for f in sorted(files):
            if fnmatch.fnmatch(f, sys.argv[1]):
                print(os.path.join(d, f))
                sys.exit(0)
EOF
}

# a directory holding lib<name>.so (a link to the wheel's lib<name>.so.N: the linker wants the plain name)
link_lib() {   # link_lib NAME SONAME_PATH -> prints the directory
    local dir="$WORK/lib"
    mkdir -p "$dir"
    ln -sf "$2" "$dir/lib$1.so"
    ln -sf "$2" "$dir/$(basename "$2")"
    echo "$dir"
}

if [ -z "$BIN" ]; then
    say "CUDA"
    NVCC="$(command -v nvcc || true)"
    for c in "${CUDA_HOME:-}/bin/nvcc" /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
        [ -z "$NVCC" ] && [ -x "$c" ] && NVCC="$c"
    done
    [ -z "$NVCC" ] && NVCC="$(wheel_file nvcc)"
    [ -n "$NVCC" ] && [ -x "$NVCC" ] || die "no nvcc (install the CUDA toolkit, or: pip install nvidia-cuda-nvcc nvidia-cuda-crt nvidia-cuda-runtime nvidia-cuda-cccl nvidia-nvvm)"
    CUDA_HOME="$(cd "$(dirname "$NVCC")/.." && pwd)"
    "$NVCC" --version | tail -2
    CUDA_LIB=""
    for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME/targets/x86_64-linux/lib"; do
        [ -z "$CUDA_LIB" ] && [ -e "$d/libcudart.so" ] && CUDA_LIB="$d"
    done
    if [ -z "$CUDA_LIB" ]; then
        RT="$(wheel_file 'libcudart.so*')"
        [ -n "$RT" ] || die "no libcudart (install the CUDA toolkit or: pip install nvidia-cuda-runtime-cu12)"
        CUDA_LIB="$(link_lib cudart "$RT")"
    fi
    echo "CUDA_HOME=$CUDA_HOME CUDA_LIB=$CUDA_LIB"

    say "NCCL"
    if [ -n "${NCCL_HOME:-}" ] && [ -e "$NCCL_HOME/include/nccl.h" ]; then
        NCCL_INC="$NCCL_HOME/include"; NCCL_LIBDIR="$NCCL_HOME/lib"
    else
        H="$(wheel_file nccl.h)"; L="$(wheel_file 'libnccl.so*')"
        [ -n "$H" ] && [ -n "$L" ] || die "no NCCL (set NCCL_HOME, or: pip install nvidia-nccl-cu12)"
        NCCL_INC="$(dirname "$H")"; NCCL_LIBDIR="$(dirname "$L")"
        [ -e "$NCCL_LIBDIR/libnccl.so" ] || NCCL_LIBDIR="$(link_lib nccl "$L")"
    fi
    # nccl-tests' Makefile takes NCCL_HOME/include and NCCL_HOME/lib: one directory with both
    NCCL_ROOT="$WORK/nccl"
    mkdir -p "$NCCL_ROOT"
    ln -sfn "$NCCL_INC" "$NCCL_ROOT/include"
    ln -sfn "$NCCL_LIBDIR" "$NCCL_ROOT/lib"
    grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$NCCL_INC/nccl.h" | tr '\n' ' '; echo
    echo "NCCL include=$NCCL_INC lib=$NCCL_LIBDIR"
fi

say "MPI"
MPI=0
MPI_HOME=""
if [ "${GPU_CHECK_MPI:-auto}" != 0 ] && command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
    inc="$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')"
    for h in "${inc:-/nonexistent}" "$(dirname "$(dirname "$(command -v mpicc)")")/include"; do
        if [ -z "$MPI_HOME" ] && [ -e "$h/mpi.h" ]; then MPI_HOME="$(dirname "$h")"; fi
    done
    [ -n "$MPI_HOME" ] && MPI=1
    mpirun --version 2>&1 | head -1
fi
echo "MPI=$MPI ${MPI_HOME:+MPI_HOME=$MPI_HOME}"

# ---------------------------------------------------------------- build
OPS_BIN="all_reduce_perf all_gather_perf broadcast_perf reduce_scatter_perf alltoall_perf"
if [ -z "$BIN" ]; then
    say "build nccl-tests ($SRC, MPI=$MPI, make -j$JOBS)"
    [ -f "$SRC/src/common.cu" ] || die "$SRC is not a nccl-tests source tree (no src/common.cu)"
    BIN="$WORK/build"
    GENCODE=""
    cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
    [ -n "$cc" ] && GENCODE="-gencode=arch=compute_$cc,code=sm_$cc"   # this GPU only: minutes less
    targets=""
    for b in $OPS_BIN; do targets="$targets $BIN/$b"; done
    # shellcheck disable=SC2086
    make -C "$SRC/src" -j"$JOBS" BUILDDIR="$BIN" MPI="$MPI" ${MPI_HOME:+MPI_HOME="$MPI_HOME"} \
        CUDA_HOME="$CUDA_HOME" CUDA_LIB="$CUDA_LIB" NVCC="$NVCC" NCCL_HOME="$NCCL_ROOT" \
        ${GENCODE:+NVCC_GENCODE="$GENCODE"} $targets > "$WORK/build.log" 2>&1
    rc=$?
    tail -5 "$WORK/build.log"
    [ $rc -eq 0 ] || { tail -40 "$WORK/build.log"; die "make failed (exit $rc): $WORK/build.log"; }
    export LD_LIBRARY_PATH="$NCCL_LIBDIR:$CUDA_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
ls -la "$BIN" | grep _perf

# ---------------------------------------------------------------- nccl-tests itself
if [ "$MPI" = 1 ]; then
    RANKS=$GPUS
    LAUNCH=(mpirun -np "$RANKS")
    [ "$(id -u)" = 0 ] && LAUNCH+=(--allow-run-as-root)
    LAUNCHER="launcher: mpirun"
else
    RANKS=1      # one process, one GPU (NCCL refuses two ranks on one GPU)
    LAUNCH=()
    LAUNCHER="launcher: none"
fi
say "nccl-tests all_reduce_perf, $RANKS rank(s), as run by hand"
RAW="$WORK/all_reduce_perf.txt"
NCCL_DEBUG=VERSION timeout 300 "${LAUNCH[@]}" "$BIN/all_reduce_perf" -b 8 -e 64M -f 8 -g 1 -c 1 -n 20 -w 5 \
    > "$RAW" 2>&1
echo "exit $?"
cat "$RAW"

# ---------------------------------------------------------------- collbench
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
CFG="$WORK/gpu_check.yaml"
RESULTS="$WORK/records.jsonl"
rm -f "$RESULTS" "$WORK/imported.jsonl"
cat > "$CFG" <<EOF
# written by scripts/gpu_check.sh
engine: nccl-tests
nccl_tests_dir: $BIN
$LAUNCHER
ranks: $RANKS
validate: true
step_timeout: 120
plan:
  - {op: allreduce, sizes: [1KB, 16KB, 256KB, 4MB], iterations: 50, warmup: 5}
  - {op: allgather, sizes: [64KB, 1MB], iterations: 50, warmup: 5, datatype: char}
  - {op: bcast, sizes: [1MB], iterations: 50, warmup: 5, datatype: char}
  - {op: reduce_scatter, sizes: [1MB], iterations: 50, warmup: 5}
  - {op: alltoall, sizes: [64KB], iterations: 50, warmup: 5, datatype: char}
EOF
say "collbench once --engine nccl-tests ($CFG)"
cat "$CFG"
(cd "$REPO" && timeout 300 "$PYTHON" -m collbench once --config "$CFG" --engine nccl-tests --results "$RESULTS")
ONCE_RC=$?
echo "exit $ONCE_RC"
say "the records ($RESULTS)"
cat "$RESULTS" 2>/dev/null

say "collbench import nccl-tests (the hand-run output above)"
(cd "$REPO" && "$PYTHON" -m collbench import nccl-tests "$RAW" --results "$WORK/imported.jsonl")
IMPORT_RC=$?
echo "exit $IMPORT_RC"
head -3 "$WORK/imported.jsonl" 2>/dev/null

# NCCL's algorithms side by side: the candidates are what NCCL's tuner prints (NCCL_DEBUG_SUBSYS=
# TUNING); an NCCL that prints no table gets a short named list instead (said in the output)
ENVFILE="$WORK/nccl_algo.env"
rm -f "$ENVFILE" "$WORK/compare.jsonl" "$WORK/compare.txt" "$WORK/replay.jsonl" "$WORK/replay.txt"
COMPARE=(compare --engine nccl-tests --config "$CFG" --op allreduce --sizes 4KB,256KB,4MB --iterations 20
         --warmup 5 --blocks "${GPU_CHECK_BLOCKS:-5}" --write-rules "$ENVFILE" --results "$WORK/compare.jsonl")
say "collbench compare --engine nccl-tests (allreduce 4KB/256KB/4MB, ${GPU_CHECK_BLOCKS:-5} blocks)"
(cd "$REPO" && timeout 300 "$PYTHON" -m collbench "${COMPARE[@]}") > "$WORK/compare.txt" 2> "$WORK/compare.err"
COMPARE_RC=$?
if [ $COMPARE_RC -eq 2 ] && grep -q "printed no NCCL tuning table" "$WORK/compare.err"; then
    cat "$WORK/compare.err"
    say "compare again with --algorithms Ring/LL,Ring/LL128,Ring/Simple,Tree/Simple (NCCL printed no tuning table)"
    (cd "$REPO" && timeout 300 "$PYTHON" -m collbench "${COMPARE[@]}" --algorithms Ring/LL,Ring/LL128,Ring/Simple,Tree/Simple) \
        > "$WORK/compare.txt" 2> "$WORK/compare.err"
    COMPARE_RC=$?
fi
cat "$WORK/compare.txt"
tail -25 "$WORK/compare.err"
echo "exit $COMPARE_RC"
say "the env file ($ENVFILE)"
cat "$ENVFILE" 2>/dev/null

# the census' configurations of a tiny NCCL log (bfloat16, float16 max, fp8 e4m3, avg, a root)
# through nccl-tests, at this machine's ranks (the log's communicator has 2)
say "collbench nccl replay --engine nccl-tests (tests/fixtures/nccl/gpu-replay-tiny.log, --np $RANKS)"
(cd "$REPO" && timeout 300 "$PYTHON" -m collbench nccl replay --engine nccl-tests --config "$CFG" \
    tests/fixtures/nccl/gpu-replay-tiny.log --np "$RANKS" --iterations 20 --warmup 5 --validate \
    --results "$WORK/replay.jsonl") > "$WORK/replay.txt"
REPLAY_RC=$?
cat "$WORK/replay.txt"
echo "exit $REPLAY_RC"
head -2 "$WORK/replay.jsonl" 2>/dev/null

# the NCCL Inspector plugin (docs/INSPECTOR.md): built from an NVIDIA/nccl checkout's plugin folder
# (GPU_CHECK_INSPECTOR_SRC: plugins/profiler/inspector, or ext-profiler/inspector before 2.29.7)
# against this NCCL, run with all_reduce_perf in JSON mode (verbose) and Prometheus mode (its
# files are unlinked at the end: copied while it runs), then imported and served by collbench.
# Not run yet on a GPU when it was written (issue 29 item 5): read its output with care.
INSPECTOR_RC=skipped
if [ -n "${GPU_CHECK_INSPECTOR_SRC:-}" ]; then
    say "build the NCCL Inspector plugin ($GPU_CHECK_INSPECTOR_SRC)"
    make -C "$GPU_CHECK_INSPECTOR_SRC" -j"$JOBS" CUDA_HOME="$CUDA_HOME" NCCL_HOME="$NCCL_ROOT" \
        > "$WORK/inspector-build.log" 2>&1
    rc=$?
    tail -5 "$WORK/inspector-build.log"
    PLUGIN="$(ls "$GPU_CHECK_INSPECTOR_SRC"/libnccl-profiler-inspector.so 2>/dev/null | head -1)"
    INSPECTOR_RC=1
    if [ $rc -eq 0 ] && [ -n "$PLUGIN" ]; then
        for mode in json prom; do
            D="$WORK/inspector-$mode"
            rm -rf "$D" "$D-kept" && mkdir -p "$D" "$D-kept"
            interval=100000; prom=0
            [ "$mode" = prom ] && interval=30000000 && prom=1
            say "all_reduce_perf with the Inspector ($mode, verbose, dump every $interval us)"
            NCCL_PROFILER_PLUGIN="$PLUGIN" NCCL_INSPECTOR_ENABLE=1 NCCL_INSPECTOR_DUMP_DIR="$D" \
                NCCL_INSPECTOR_DUMP_VERBOSE=1 NCCL_INSPECTOR_PROM_DUMP=$prom \
                NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS=$interval \
                timeout 300 "${LAUNCH[@]}" "$BIN/all_reduce_perf" -b 64K -e 64M -f 4 -g 1 -n 2000 -w 5 \
                > "$D.out" 2>&1 &
            pid=$!
            while kill -0 $pid 2>/dev/null; do cp -f "$D"/* "$D-kept/" 2>/dev/null; sleep 1; done
            wait $pid
            echo "exit $?"
            tail -5 "$D.out"
            ls -la "$D-kept"
            head -c 2000 "$D-kept"/* 2>/dev/null; echo
        done
        say "collbench import nccl-inspector (the plugin's own files)"
        (cd "$REPO" && "$PYTHON" -m collbench import nccl-inspector "$WORK/inspector-json-kept" \
            "$WORK/inspector-prom-kept" --results "$WORK/inspector.jsonl")
        INSPECTOR_RC=$?
        echo "exit $INSPECTOR_RC"
        head -2 "$WORK/inspector.jsonl" 2>/dev/null
        say "collbench exporter --inspector-dir (one scrape)"
        port=$(( 20000 + RANDOM % 20000 ))
        (cd "$REPO" && "$PYTHON" -m collbench exporter --counters-only --collectors netstat \
            --listen "127.0.0.1:$port" --inspector-dir "$WORK/inspector-json-kept") > "$WORK/exporter.log" 2>&1 &
        epid=$!
        sleep 5
        "$PYTHON" -c "import urllib.request,sys; t=urllib.request.urlopen(sys.argv[1]).read().decode(); \
print('\n'.join(l for l in t.splitlines() if l.startswith('collbench_inspector'))[:6000])" \
            "http://127.0.0.1:$port/metrics" || INSPECTOR_RC=1
        kill $epid 2>/dev/null; wait $epid 2>/dev/null
    fi
fi

if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    cp -f "$RAW" "$CFG" "$RESULTS" "$WORK/imported.jsonl" "$WORK/compare.txt" "$WORK/compare.jsonl" \
        "$ENVFILE" "$WORK/replay.txt" "$WORK/replay.jsonl" "$OUT/" 2>/dev/null
    [ -f "$WORK/build.log" ] && tail -200 "$WORK/build.log" > "$OUT/build.log.tail"
    for d in inspector-json-kept inspector-prom-kept; do
        [ -d "$WORK/$d" ] && mkdir -p "$OUT/$d" && cp -f "$WORK/$d"/* "$OUT/$d/" 2>/dev/null
    done
    cp -f "$WORK/inspector.jsonl" "$OUT/" 2>/dev/null
fi
say "done: once exit $ONCE_RC, import exit $IMPORT_RC, compare exit $COMPARE_RC, replay exit $REPLAY_RC, inspector $INSPECTOR_RC"
[ $ONCE_RC -eq 0 ] && [ $IMPORT_RC -eq 0 ] && [ $COMPARE_RC -eq 0 ] && [ $REPLAY_RC -eq 0 ]
