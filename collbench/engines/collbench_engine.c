/*
 * collbench-engine: the built-in MPI collective benchmark (C99; this file keeps ops, plan, timing
 * and validation; the counter and off-CPU readers are beside it: collbench_engine.h).
 *
 *   collbench-engine --plan FILE [--loop] [--validate] [--max-loops N] [--report-hosts] [--congestion SPEC]
 *   collbench-engine --pairs --lat-size B --bw-size B --iterations N [--warmup N] [--concurrent]
 *
 * Plan file: one step per line, "op size_bytes iterations warmup datatype [key=value ...]",
 * '#' comments. Optional keys: inplace=0|1 (MPI_IN_PLACE), root=N (the timed root of bcast and
 * reduce), timing=osu|sustained, samples=0|1 (per-iteration times: percentiles in the record).
 * Rank 0 reads it and broadcasts it, so only the launching host needs the file.
 * Rank 0 prints one "CBREC {json}" line per finished step on stdout, each flushed as one
 * write (the times per call over ranks: avg/min/max_us, max_rank the rank with the largest; and
 * offcpu_rank, the rank whose thread was off its CPU the largest share offcpu_max of the loop,
 * offcpu_avg the mean share: the rank the others waited for, see run_timed);
 * with --report-hosts first one "CBHOSTS {json}" line: the host of every rank.
 * With --congestion SPEC, before each CBREC one "CBCONG {json}" line: the counters that moved on
 * each host during the step (engine_counters.c).
 *
 * timing=sustained is the other convention (AllgatherP's): a barrier, then every iteration back
 * to back with no barrier between them, each rank's elapsed time / iterations, min / max / sum
 * over the ranks. It measures pipelined throughput, which OSU's per-iteration barrier hides.
 *
 * --pairs measures the point-to-point distance matrix: every pair of ranks, in P-1 rounds of
 * disjoint pairs (the circle method; P rounds with a bye when P is odd), ping-pong at a small
 * size (latency = half the round trip) and a large one (bandwidth = size / half the round
 * trip); one pair at a time, or with --concurrent every pair of a round at once. Rank 0 prints
 * one "CBPAIR {json}" line per pair.
 *
 * Timing follows OSU Micro-Benchmarks 7.4 so the numbers agree with osu_<op>:
 * a barrier before each step, warm-up iterations run but untimed, MPI_Wtime around the
 * collective call only, a barrier between iterations (before the call for reduce, after it
 * for the others, none for barrier, as osu_<op>.c place them), root 0 for bcast and reduce
 * (OSU 7.4's default; it rotates only with -k rotate, which measures something else: with
 * 2 ranks a rotating root ran small reduces ~45 % and small bcasts ~30 % faster than OSU
 * and large bcasts twice as slow),
 * char data as MPI_CHAR also in reductions (OSU 7.4's default), each rank's average over
 * the timed iterations, then min / max / sum of the per-rank averages reduced to rank 0
 * (avg = sum / ranks).
 * Buffers are page-aligned, allocated once for the largest step of the plan and touched
 * (send filled with 1s, receive with 0s) before any timing, as OSU does.
 *
 * --validate checks every element of every result on every rank after the timed loop, on
 * separate calls with rank-dependent data, then restores OSU's buffer contents so
 * validation never changes what the next step times.
 *
 * A first SIGTERM/SIGINT lets the step in progress finish and the ranks agree at its boundary,
 * for at most COLLBENCH_ENGINE_STOP_GRACE seconds (default 5): a step that cannot finish (a peer
 * died, or is stopped) would otherwise hold every rank until the launcher's SIGKILL (Slurm's
 * KillWait, 30 s by default). Past it the rank says so on stderr and dies by the signal.
 *
 * Exit codes: 0 success (also after a SIGTERM/SIGINT honoured at a step boundary),
 * 1 a validation failure with --validate, 2 bad arguments or a bad plan,
 * 3 the plan's buffers cannot be allocated, 4 an MPI call failed (the engine's error handler on
 * MPI_COMM_WORLD prints MPI's own error text, then exits: see on_mpi_error).
 */
#define _POSIX_C_SOURCE 200809L

#include <mpi.h>

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "collbench_engine.h"

#define MAX_PLAN_BYTES (1 << 20)
#define MAX_TOKEN 64
#define MAX_ITERATIONS 1000000000000LL /* warm-up + iterations never overflow */

/* ------------------------------------------------------------------ datatypes */

/* short and long stand in for what MPI has no type for (NCCL's float16/bfloat16, 8-byte ints):
 * the same bytes moved; reductions on them are integer sums. */
enum { DT_CHAR, DT_SHORT, DT_INT, DT_FLOAT, DT_DOUBLE, DT_LONG, DT_COUNT };

static const struct {
    const char *name;
    size_t size;
} DATATYPES[DT_COUNT] = {
    {"char", 1}, {"short", sizeof(short)}, {"int", sizeof(int)}, {"float", sizeof(float)},
    {"double", sizeof(double)}, {"long", sizeof(long long)},
};

/* Reductions on char: MPI_CHAR as OSU 7.4 times them, where the MPI accepts MPI_SUM on it
 * (Open MPI does); MPI_SIGNED_CHAR where it does not (the standard defines MPI_SUM only on
 * the latter). Decided once at start-up by probe_char_sum(). */
static int char_sum_ok = 0;

/* MPI handles are not compile-time constants in every MPI, hence a function. */
static MPI_Datatype mpi_datatype(int dt, int reduction)
{
    switch (dt) {
        case DT_CHAR: return reduction && !char_sum_ok ? MPI_SIGNED_CHAR : MPI_CHAR;
        case DT_SHORT: return MPI_SHORT;
        case DT_LONG: return MPI_LONG_LONG;
        case DT_INT: return MPI_INT;
        case DT_FLOAT: return MPI_FLOAT;
        default: return MPI_DOUBLE;
    }
}

static void put_value(void *buf, int dt, size_t i, long long v)
{
    switch (dt) {
        case DT_CHAR: ((signed char *)buf)[i] = (signed char)v; break;
        case DT_SHORT: ((short *)buf)[i] = (short)v; break;
        case DT_LONG: ((long long *)buf)[i] = v; break;
        case DT_INT: ((int *)buf)[i] = (int)v; break;
        case DT_FLOAT: ((float *)buf)[i] = (float)v; break;
        default: ((double *)buf)[i] = (double)v; break;
    }
}

/* The element as a double; every validation value is an integer exact in its type. */
static double get_value(const void *buf, int dt, size_t i)
{
    switch (dt) {
        case DT_CHAR: return ((const signed char *)buf)[i];
        case DT_SHORT: return ((const short *)buf)[i];
        case DT_LONG: return (double)((const long long *)buf)[i];
        case DT_INT: return ((const int *)buf)[i];
        case DT_FLOAT: return ((const float *)buf)[i];
        default: return ((const double *)buf)[i];
    }
}

static int value_matches(const void *buf, int dt, size_t i, long long expected)
{
    double want;
    switch (dt) {
        case DT_CHAR: want = (signed char)expected; break;
        case DT_SHORT: want = (short)expected; break;
        case DT_LONG: want = (double)expected; break;
        case DT_INT: want = (int)expected; break;
        case DT_FLOAT: want = (float)expected; break;
        default: want = (double)expected; break;
    }
    return get_value(buf, dt, i) == want;
}

/* Reduction inputs: 1 + (rank % A) + (i % B). Small enough that a sum over the ranks is
 * exact (float below 2^24; signed char below 128 up to 42 ranks; short below 2^15 up to
 * 1400 ranks), and the expected sum has a closed form, so checking costs O(count) and not
 * O(count x ranks). */
static long long red_a(int dt) { return dt == DT_CHAR ? 2 : dt == DT_SHORT ? 16 : 1000; }
static long long red_b(int dt) { return dt == DT_CHAR ? 2 : 7; }

static long long red_value(int rank, size_t i, int dt)
{
    return 1 + rank % red_a(dt) + (long long)(i % (size_t)red_b(dt));
}

static long long red_sum(int nranks, size_t i, int dt)
{
    long long sum = 0;
    for (int q = 0; q < nranks; q++)
        sum += q % red_a(dt);
    return sum + nranks * (1 + (long long)(i % (size_t)red_b(dt)));
}

/* Data inputs for ops that move data: distinct per (source, destination, element). */
static long long data_value(int src, int dst, size_t i, int dt)
{
    long long m = dt == DT_CHAR ? 127 : dt == DT_SHORT ? 32749 : 8388593; /* exact in float */
    return ((long long)src * 7919 + (long long)dst * 104729 + (long long)(i % 1000003) * 31 + 1) % m;
}

/* ------------------------------------------------------------------ steps and the op table */

enum { TIMING_OSU, TIMING_SUSTAINED };
static const char *const TIMING_NAMES[] = {"osu", "sustained"};

typedef struct {
    int op;         /* index in OPS */
    size_t size;    /* bytes per rank (OSU's message size) */
    long long iterations;
    long long warmup;
    int dt;
    int inplace;    /* MPI_IN_PLACE */
    int root;       /* timed root of rooted ops */
    int timing;     /* TIMING_* */
    int samples;    /* keep per-iteration times for percentiles */
    int line;
} Step;

typedef struct {
    MPI_Comm comm;
    int rank, nranks;
    const Step *step;
    size_t count;          /* elements per rank (per peer for alltoall) */
    MPI_Datatype type;
    void *sendbuf, *recvbuf;
    void *sendarg;         /* sendbuf, or MPI_IN_PLACE for an in-place step */
    int *recvcounts;       /* reduce_scatter */
    char *first_error;     /* first mismatch seen on this rank, for stderr */
    size_t first_error_len;
} Coll;

typedef int (*call_fn)(Coll *c, int root);
typedef void (*fill_fn)(Coll *c, int root);
typedef long (*check_fn)(Coll *c, int root);

typedef struct {
    const char *name;
    int reduction;          /* takes MPI_SUM */
    int has_size;           /* barrier has none */
    int send_times_n;       /* send buffer is size x ranks (alltoall) */
    int recv_times_n;       /* receive buffer is size x ranks (allgather, alltoall) */
    int uses_recv;          /* bcast works in one buffer */
    int sync_before;        /* OSU 7.4's barrier placement around each iteration */
    int sync_after;
    int rooted;             /* has a root: 0 when timed (OSU 7.4's default), validation adds the last rank */
    int uneven_split;       /* size is the whole send buffer, split in near-equal blocks (reduce_scatter) */
    call_fn call;
    fill_fn fill;           /* validation input; NULL: nothing to validate */
    check_fn check;
} OpDef;

/* Keep the first mismatch of this rank for its one stderr line. */
static void note_error(Coll *c, const void *buf, size_t i, long long expected)
{
    if (c->first_error[0])
        return;
    snprintf(c->first_error, c->first_error_len, "first: element %zu is %.17g, expected %lld",
             i, get_value(buf, c->step->dt, i), expected);
}

static void fill_sentinel(void *buf, size_t bytes) { memset(buf, 0xff, bytes); } /* -1 / NaN */

/* allreduce */
static int call_allreduce(Coll *c, int root)
{
    (void)root;
    return MPI_Allreduce(c->sendarg, c->recvbuf, (int)c->count, c->type, MPI_SUM, c->comm);
}
static void fill_reduction(Coll *c, int root)
{
    (void)root;
    for (size_t i = 0; i < c->count; i++)
        put_value(c->sendbuf, c->step->dt, i, red_value(c->rank, i, c->step->dt));
    fill_sentinel(c->recvbuf, c->count * DATATYPES[c->step->dt].size);
}
static long check_sum_all(Coll *c, size_t offset, size_t n)
{
    long errors = 0;
    for (size_t j = 0; j < n; j++) {
        long long want = red_sum(c->nranks, offset + j, c->step->dt);
        if (!value_matches(c->recvbuf, c->step->dt, j, want)) {
            if (!errors)
                note_error(c, c->recvbuf, j, want);
            errors++;
        }
    }
    return errors;
}
static long check_allreduce(Coll *c, int root)
{
    (void)root;
    return check_sum_all(c, 0, c->count);
}

/* reduce */
static int call_reduce(Coll *c, int root)
{
    /* in place only at the root: the standard forbids MPI_IN_PLACE elsewhere */
    void *send = c->sendarg == MPI_IN_PLACE && c->rank != root ? c->sendbuf : c->sendarg;
    return MPI_Reduce(send, c->recvbuf, (int)c->count, c->type, MPI_SUM, root, c->comm);
}
static long check_reduce(Coll *c, int root)
{
    return c->rank == root ? check_sum_all(c, 0, c->count) : 0;
}

/* reduce_scatter: size is the whole send buffer, split in near-equal blocks as OSU does */
static int call_reduce_scatter(Coll *c, int root)
{
    (void)root;
    return MPI_Reduce_scatter(c->sendarg, c->recvbuf, c->recvcounts, c->type, MPI_SUM, c->comm);
}
static long check_reduce_scatter(Coll *c, int root)
{
    (void)root;
    size_t offset = 0;
    for (int q = 0; q < c->rank; q++)
        offset += (size_t)c->recvcounts[q];
    return check_sum_all(c, offset, (size_t)c->recvcounts[c->rank]);
}

/* bcast: one buffer, data from the root */
static int call_bcast(Coll *c, int root)
{
    return MPI_Bcast(c->sendbuf, (int)c->count, c->type, root, c->comm);
}
static void fill_bcast(Coll *c, int root)
{
    if (c->rank != root) {
        fill_sentinel(c->sendbuf, c->count * DATATYPES[c->step->dt].size);
        return;
    }
    for (size_t i = 0; i < c->count; i++)
        put_value(c->sendbuf, c->step->dt, i, data_value(root, 0, i, c->step->dt));
}
static long check_bcast(Coll *c, int root)
{
    long errors = 0;
    for (size_t i = 0; i < c->count; i++) {
        long long want = data_value(root, 0, i, c->step->dt);
        if (!value_matches(c->sendbuf, c->step->dt, i, want)) {
            if (!errors)
                note_error(c, c->sendbuf, i, want);
            errors++;
        }
    }
    return errors;
}

/* allgather: size is each rank's contribution */
static int call_allgather(Coll *c, int root)
{
    (void)root;
    return MPI_Allgather(c->sendarg, (int)c->count, c->type, c->recvbuf, (int)c->count, c->type,
                         c->comm);
}
static void fill_allgather(Coll *c, int root)
{
    (void)root;
    for (size_t i = 0; i < c->count; i++)
        put_value(c->sendbuf, c->step->dt, i, data_value(c->rank, 0, i, c->step->dt));
    fill_sentinel(c->recvbuf, c->count * (size_t)c->nranks * DATATYPES[c->step->dt].size);
}
static long check_allgather(Coll *c, int root)
{
    (void)root;
    long errors = 0;
    for (int q = 0; q < c->nranks; q++)
        for (size_t i = 0; i < c->count; i++) {
            size_t at = (size_t)q * c->count + i;
            long long want = data_value(q, 0, i, c->step->dt);
            if (!value_matches(c->recvbuf, c->step->dt, at, want)) {
                if (!errors)
                    note_error(c, c->recvbuf, at, want);
                errors++;
            }
        }
    return errors;
}

/* alltoall: size is the bytes sent to each peer */
static int call_alltoall(Coll *c, int root)
{
    (void)root;
    return MPI_Alltoall(c->sendarg, (int)c->count, c->type, c->recvbuf, (int)c->count, c->type,
                        c->comm);
}
static void fill_alltoall(Coll *c, int root)
{
    (void)root;
    for (int p = 0; p < c->nranks; p++)
        for (size_t i = 0; i < c->count; i++)
            put_value(c->sendbuf, c->step->dt, (size_t)p * c->count + i,
                      data_value(c->rank, p, i, c->step->dt));
    fill_sentinel(c->recvbuf, c->count * (size_t)c->nranks * DATATYPES[c->step->dt].size);
}
static long check_alltoall(Coll *c, int root)
{
    (void)root;
    long errors = 0;
    for (int p = 0; p < c->nranks; p++)
        for (size_t i = 0; i < c->count; i++) {
            size_t at = (size_t)p * c->count + i;
            long long want = data_value(p, c->rank, i, c->step->dt);
            if (!value_matches(c->recvbuf, c->step->dt, at, want)) {
                if (!errors)
                    note_error(c, c->recvbuf, at, want);
                errors++;
            }
        }
    return errors;
}

/* barrier: no data; its validation is "off" */
static int call_barrier(Coll *c, int root)
{
    (void)root;
    return MPI_Barrier(c->comm);
}

static const OpDef OPS[] = {
    /* name          red size sendN recvN recv before after rooted uneven call                 fill            check */
    {"allreduce",      1,  1,   0,    0,    1,   0,     1,    0,     0,     call_allreduce,      fill_reduction, check_allreduce},
    {"bcast",          0,  1,   0,    0,    0,   0,     1,    1,     0,     call_bcast,          fill_bcast,     check_bcast},
    {"reduce",         1,  1,   0,    0,    1,   1,     0,    1,     0,     call_reduce,         fill_reduction, check_reduce},
    {"allgather",      0,  1,   0,    1,    1,   0,     1,    0,     0,     call_allgather,      fill_allgather, check_allgather},
    {"alltoall",       0,  1,   1,    1,    1,   0,     1,    0,     0,     call_alltoall,       fill_alltoall,  check_alltoall},
    {"reduce_scatter", 1,  1,   0,    0,    1,   0,     1,    0,     1,     call_reduce_scatter, fill_reduction, check_reduce_scatter},
    {"barrier",        0,  0,   0,    0,    0,   0,     0,    0,     0,     call_barrier,        NULL,           NULL},
};
#define NOPS ((int)(sizeof(OPS) / sizeof(OPS[0])))

static size_t send_bytes(const OpDef *op, size_t size, int nranks)
{
    return op->has_size ? size * (op->send_times_n ? (size_t)nranks : 1) : 0;
}

static size_t recv_bytes(const OpDef *op, size_t size, int nranks)
{
    return op->has_size && op->uses_recv ? size * (op->recv_times_n ? (size_t)nranks : 1) : 0;
}

/* ------------------------------------------------------------------ plan parsing */

typedef struct {
    Step *steps;
    int nsteps;
} Plan;

static int find_op(const char *name)
{
    for (int i = 0; i < NOPS; i++)
        if (strcmp(OPS[i].name, name) == 0)
            return i;
    return -1;
}

static int find_datatype(const char *name)
{
    for (int i = 0; i < DT_COUNT; i++)
        if (strcmp(DATATYPES[i].name, name) == 0)
            return i;
    return -1;
}

/* "allreduce, bcast, ..." from the tables themselves, so a new row needs no second list */
static const char *op_names(void)
{
    static char buf[256];
    if (!buf[0])
        for (int i = 0; i < NOPS; i++)
            snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "%s%s", i ? ", " : "", OPS[i].name);
    return buf;
}

static const char *datatype_names(void)
{
    static char buf[128];
    if (!buf[0])
        for (int i = 0; i < DT_COUNT; i++)
            snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "%s%s", i ? ", " : "", DATATYPES[i].name);
    return buf;
}

static int parse_long(const char *s, long long min, long long max, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

#define MAX_FIELDS 10

/* One optional "key=value" field of a plan line into s; -1 (and msg) when it is not one. */
static int parse_option(const char *tok, Step *s, int nranks, const char *path, int lineno,
                        char *msg, size_t msglen)
{
    const char *eq = strchr(tok, '=');
    long long v;
    if (!eq) {
        snprintf(msg, msglen, "plan %s line %d: extra field '%s' is not key=value "
                 "(inplace, root, timing or samples)", path, lineno, tok);
        return -1;
    }
    const char *val = eq + 1;
    size_t klen = (size_t)(eq - tok);
    if (klen == 7 && strncmp(tok, "inplace", 7) == 0 && parse_long(val, 0, 1, &v) == 0)
        s->inplace = (int)v;
    else if (klen == 7 && strncmp(tok, "samples", 7) == 0 && parse_long(val, 0, 1, &v) == 0)
        s->samples = (int)v;
    else if (klen == 4 && strncmp(tok, "root", 4) == 0 && parse_long(val, 0, nranks - 1, &v) == 0)
        s->root = (int)v;
    else if (klen == 6 && strncmp(tok, "timing", 6) == 0 && strcmp(val, "osu") == 0)
        s->timing = TIMING_OSU;
    else if (klen == 6 && strncmp(tok, "timing", 6) == 0 && strcmp(val, "sustained") == 0)
        s->timing = TIMING_SUSTAINED;
    else {
        snprintf(msg, msglen, "plan %s line %d: bad field '%s' (expected inplace=0|1, samples=0|1, "
                 "root=0..%d or timing=osu|sustained)", path, lineno, tok, nranks - 1);
        return -1;
    }
    return 0;
}

/* Parse the plan text; on error fill msg and return -1. Identical on every rank. */
static int parse_plan(char *text, const char *path, int nranks, Plan *plan, char *msg, size_t msglen)
{
    int cap = 16, lineno = 0;
    plan->steps = malloc(sizeof(Step) * (size_t)cap);
    plan->nsteps = 0;
    if (!plan->steps) {
        snprintf(msg, msglen, "out of memory reading plan %s", path);
        return -1;
    }
    for (char *line = text, *next; line; line = next) {
        /* split by hand: strtok would skip blank lines and so miscount line numbers */
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char tok[MAX_FIELDS][MAX_TOKEN];
        int ntok = 0;
        char *tsave = NULL;
        for (char *t = strtok_r(line, " \t\r", &tsave); t; t = strtok_r(NULL, " \t\r", &tsave)) {
            if (ntok < MAX_FIELDS)
                snprintf(tok[ntok], MAX_TOKEN, "%s", t);
            ntok++;
        }
        if (ntok == 0)
            continue;
        if (ntok < 5 || ntok > MAX_FIELDS) {
            snprintf(msg, msglen, "plan %s line %d: expected 5 fields "
                     "\"op size_bytes iterations warmup datatype\" and at most %d key=value fields, got %d",
                     path, lineno, MAX_FIELDS - 5, ntok);
            return -1;
        }
        Step s;
        long long v;
        memset(&s, 0, sizeof(s));
        s.line = lineno;
        s.op = find_op(tok[0]);
        if (s.op < 0) {
            snprintf(msg, msglen, "plan %s line %d: unknown op '%s' (expected one of: %s)",
                     path, lineno, tok[0], op_names());
            return -1;
        }
        s.dt = find_datatype(tok[4]);
        if (s.dt < 0) {
            snprintf(msg, msglen, "plan %s line %d: unknown datatype '%s' (expected one of: %s)",
                     path, lineno, tok[4], datatype_names());
            return -1;
        }
        for (int k = 5; k < ntok; k++)
            if (parse_option(tok[k], &s, nranks, path, lineno, msg, msglen) < 0)
                return -1;
        const OpDef *op = &OPS[s.op];
        if (parse_long(tok[1], op->has_size ? 1 : 0, op->has_size ? INT_MAX : 0, &v) < 0) {
            snprintf(msg, msglen, op->has_size
                     ? "plan %s line %d: size_bytes '%s' is not a whole number from 1 to 2147483647"
                     : "plan %s line %d: size_bytes '%s' must be 0 for barrier", path, lineno, tok[1]);
            return -1;
        }
        s.size = (size_t)v;
        if (s.size % DATATYPES[s.dt].size) {
            snprintf(msg, msglen, "plan %s line %d: size %zu B is not a multiple of the %s size (%zu B)",
                     path, lineno, s.size, DATATYPES[s.dt].name, DATATYPES[s.dt].size);
            return -1;
        }
        if (parse_long(tok[2], 1, MAX_ITERATIONS, &v) < 0) {
            snprintf(msg, msglen, "plan %s line %d: iterations '%s' is not a whole number from 1 to 10^12",
                     path, lineno, tok[2]);
            return -1;
        }
        s.iterations = v;
        if (parse_long(tok[3], 0, MAX_ITERATIONS, &v) < 0) {
            snprintf(msg, msglen, "plan %s line %d: warmup '%s' is not a whole number from 0 to 10^12",
                     path, lineno, tok[3]);
            return -1;
        }
        s.warmup = v;
        if (plan->nsteps == cap) {
            cap *= 2;
            Step *grown = realloc(plan->steps, sizeof(Step) * (size_t)cap);
            if (!grown) {
                snprintf(msg, msglen, "out of memory reading plan %s", path);
                return -1;
            }
            plan->steps = grown;
        }
        plan->steps[plan->nsteps++] = s;
    }
    if (plan->nsteps == 0) {
        snprintf(msg, msglen, "plan %s has no steps (expected lines "
                 "\"op size_bytes iterations warmup datatype\")", path);
        return -1;
    }
    return 0;
}

/* Read at most limit bytes of f into a buffer grown only as far as the text needs. Never one
 * limit-sized malloc up front: a plan is a few KB, and freeing a 1 MB block (glibc serves it
 * with mmap) raises glibc's dynamic mmap threshold, after which MPI's own temporary buffers
 * of 128 KB .. 1 MB come from the heap instead of fresh mmaps - rank 0 then ran 128 KB
 * reduce_scatter ~15 % faster than osu_reduce_scatter, which never frees such a block. */
char *read_bounded(FILE *f, size_t limit, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap || cap >= limit || ferror(f))
            break;
        size_t grown_cap = cap * 2 < limit ? cap * 2 : limit;
        char *grown = realloc(buf, grown_cap + 1);
        if (!grown) {
            free(buf);
            return NULL;
        }
        buf = grown;
        cap = grown_cap;
    }
    *len = n;
    return buf;
}

/* Rank 0 reads the file; every rank gets its text. NULL (and msg) when unreadable. */
static char *read_plan_everywhere(const char *path, int rank, char *msg, size_t msglen)
{
    long long len = -1;
    char *text = NULL;
    if (rank == 0) {
        FILE *f = fopen(path, "r");
        if (!f) {
            snprintf(msg, msglen, "cannot read plan %s: %s", path, strerror(errno));
        } else {
            size_t n = 0;
            text = read_bounded(f, MAX_PLAN_BYTES + 1, &n);
            if (!text)
                snprintf(msg, msglen, "out of memory reading plan %s", path);
            else if (ferror(f))
                snprintf(msg, msglen, "cannot read plan %s: %s", path, strerror(errno));
            else if (n > MAX_PLAN_BYTES)
                snprintf(msg, msglen, "plan %s is larger than %d bytes", path, MAX_PLAN_BYTES);
            else if (memchr(text, '\0', n))
                snprintf(msg, msglen, "plan %s is not a text file", path);
            else
                len = (long long)n;
            fclose(f);
        }
    }
    MPI_Bcast(&len, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    if (len < 0) {
        free(text);
        return NULL;
    }
    if (rank != 0 && !(text = malloc((size_t)len + 1)))
        MPI_Abort(MPI_COMM_WORLD, EXIT_NO_MEMORY);
    MPI_Bcast(text, (int)len, MPI_CHAR, 0, MPI_COMM_WORLD);
    text[len] = '\0';
    return text;
}

/* ------------------------------------------------------------------ signals */

static volatile sig_atomic_t stop_signal = 0;
static unsigned stop_grace = 5;       /* seconds the step in progress gets after the first signal */
static char grace_note[160];          /* written by the alarm handler: formatted before any signal */

/* First SIGTERM/SIGINT: finish the step in progress (its record is printed whole), agree at
 * the step boundary and exit 0, within stop_grace seconds (the alarm below). A second one:
 * die at once. */
static void on_stop_signal(int sig)
{
    if (stop_signal) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    stop_signal = sig;
    alarm(stop_grace);
}

/* The grace is over: the step or the agreement after it is stuck (a peer gone or stopped). Die by
 * the stop signal, as the launcher asked, rather than wait for its SIGKILL. */
static void on_stop_grace_over(int sig)
{
    ssize_t ignored = write(STDERR_FILENO, grace_note, strlen(grace_note));
    (void)ignored;
    (void)sig;
    signal(stop_signal, SIG_DFL);
    raise(stop_signal);
}

static void install_signal_handlers(void)
{
    struct sigaction sa;
    const char *grace = getenv("COLLBENCH_ENGINE_STOP_GRACE");
    long long seconds;
    if (grace && *grace && parse_long(grace, 1, 86400, &seconds) == 0)
        stop_grace = (unsigned)seconds;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_stop_grace_over;
    sigaction(SIGALRM, &sa, NULL);
}

static void set_grace_note(int rank)
{
    snprintf(grace_note, sizeof(grace_note), "collbench-engine: rank %d: the step in progress did not "
             "end within %us of the stop signal (a peer gone?): stopping now\n", rank, stop_grace);
}

/* ------------------------------------------------------------------ one step */

typedef struct {
    double avg_us, min_us, max_us;
    int max_rank;                          /* the rank with the largest time per call (max_us) */
    int offcpu_rank;                       /* the rank off its CPU the largest share of the loop */
    double offcpu_max, offcpu_avg;         /* that share (0..1), and the mean over ranks */
    double t_start, t_end;
    const char *validation;
    int have_pct;                          /* samples=1: percentiles below are set */
    double p50_us, p90_us, p99_us, pmax_us;
} StepResult;

#define MAX_SAMPLES (1 << 20)  /* per-iteration times kept: the first 2^20 iterations */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[0..n-1]. */
static double percentile(const double *v, size_t n, double pct)
{
    size_t k = (size_t)(pct / 100.0 * (double)n + 0.999999);
    return v[k == 0 ? 0 : (k > n ? n : k) - 1];
}

double wall_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void setup_coll(Coll *c, const Step *s)
{
    const OpDef *op = &OPS[s->op];
    c->step = s;
    c->count = s->size / DATATYPES[s->dt].size;
    c->type = mpi_datatype(s->dt, op->reduction);
    c->sendarg = s->inplace && op->uses_recv ? MPI_IN_PLACE : c->sendbuf;
    if (op->uneven_split) {
        /* OSU's split: count / n each, the first count % n ranks one more */
        size_t portion = c->count / (size_t)c->nranks, remainder = c->count % (size_t)c->nranks;
        for (int i = 0; i < c->nranks; i++)
            c->recvcounts[i] = (int)(portion + ((size_t)i < remainder ? 1 : 0));
    }
}

/* OSU's buffer contents: send bytes 1, receive bytes 0 */
static void touch_buffers(Coll *c, size_t sbytes, size_t rbytes)
{
    if (sbytes)
        memset(c->sendbuf, 1, sbytes);
    if (rbytes)
        memset(c->recvbuf, 0, rbytes);
}

/* The collective's time per iteration = the slowest rank's, per iteration (MAX over ranks);
 * its percentiles to rank 0. */
static void reduce_percentiles(Coll *c, double *samples, size_t n, StepResult *r)
{
    double *worst = c->rank == 0 ? malloc(sizeof(double) * (n ? n : 1)) : NULL;
    int ok = c->rank != 0 || worst != NULL;
    /* counts of int: reduce in chunks */
    for (size_t off = 0; off < n; off += (size_t)INT_MAX / 2) {
        size_t len = n - off < (size_t)INT_MAX / 2 ? n - off : (size_t)INT_MAX / 2;
        MPI_Reduce(samples + off, worst ? worst + off : samples + off, (int)len, MPI_DOUBLE,
                   MPI_MAX, 0, c->comm);
    }
    if (c->rank == 0 && ok && n) {
        qsort(worst, n, sizeof(double), cmp_double);
        r->p50_us = percentile(worst, n, 50) * 1e6;
        r->p90_us = percentile(worst, n, 90) * 1e6;
        r->p99_us = percentile(worst, n, 99) * 1e6;
        r->pmax_us = worst[n - 1] * 1e6;
        r->have_pct = 1;
    }
    free(worst);
}

static void run_timed(Coll *c, StepResult *r)
{
    const OpDef *op = &OPS[c->step->op];
    const Step *s = c->step;
    long long total = s->warmup + s->iterations;
    int root = s->root;
    double timer = 0.0;
    size_t nsamples = s->samples && s->timing == TIMING_OSU
                      ? (size_t)(s->iterations < MAX_SAMPLES ? s->iterations : MAX_SAMPLES) : 0;
    double *samples = nsamples ? malloc(sizeof(double) * nsamples) : NULL;
    int have_samples = samples != NULL, all_have = 0;
    MPI_Allreduce(&have_samples, &all_have, 1, MPI_INT, MPI_MIN, c->comm);
    if (!all_have) {  /* every rank keeps samples, or none does */
        free(samples);
        samples = NULL;
        nsamples = 0;
    }
    memset(r, 0, sizeof(*r));

    MPI_Barrier(c->comm);
    r->t_start = wall_clock();
    double cpu0 = offcpu_clock();
    if (s->timing == TIMING_SUSTAINED) {
        for (long long i = 0; i < s->warmup; i++)
            op->call(c, root);
        MPI_Barrier(c->comm);
        double t0 = MPI_Wtime();
        for (long long i = 0; i < s->iterations; i++)
            op->call(c, root);
        timer = MPI_Wtime() - t0;
    } else {
        for (long long i = 0; i < total; i++) {
            if (op->sync_before)
                MPI_Barrier(c->comm);
            double t0 = MPI_Wtime();
            op->call(c, root);
            double t1 = MPI_Wtime();
            if (op->sync_after)
                MPI_Barrier(c->comm);
            if (i >= s->warmup) {
                timer += t1 - t0;
                if ((size_t)(i - s->warmup) < nsamples)
                    samples[i - s->warmup] = t1 - t0;
            }
        }
    }
    double cpu1 = offcpu_clock();
    r->t_end = wall_clock();
    if (nsamples) {
        reduce_percentiles(c, samples, nsamples, r);
        free(samples);
    }

    double latency = timer * 1e6 / (double)c->step->iterations, sum = 0.0;
    struct { double value; int rank; } mine = {latency, c->rank}, worst = {0.0, 0};
    /* OSU's three reductions, in its order and types, so the MPI does between steps what it
     * does in osu_<op> (an MPI_DOUBLE_INT MAXLOC in place of the MAX left the second size of
     * allreduce a few percent off OSU's); the straggler's rank comes after, on its own */
    MPI_Reduce(&latency, &r->min_us, 1, MPI_DOUBLE, MPI_MIN, 0, c->comm);
    MPI_Reduce(&latency, &r->max_us, 1, MPI_DOUBLE, MPI_MAX, 0, c->comm);
    MPI_Reduce(&latency, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, c->comm);
    MPI_Reduce(&mine, &worst, 1, MPI_DOUBLE_INT, MPI_MAXLOC, 0, c->comm);
    r->max_rank = worst.rank;
    r->avg_us = sum / c->nranks;
    /* the rank the others waited for, after the timed figures (engine_offcpu.c) */
    offcpu_reduce(cpu0, cpu1, r->t_end - r->t_start, c->rank, c->nranks, c->comm,
                  &r->offcpu_rank, &r->offcpu_max, &r->offcpu_avg);
}

/* In place: the input fill() wrote to the send buffer goes where MPI_IN_PLACE reads it (this
 * rank's block of the receive buffer for allgather, the whole receive buffer otherwise). */
static void place_input(Coll *c)
{
    const OpDef *op = &OPS[c->step->op];
    size_t sb = send_bytes(op, c->step->size, c->nranks);
    size_t at = op->recv_times_n && !op->send_times_n ? (size_t)c->rank * sb : 0;
    memcpy((char *)c->recvbuf + at, c->sendbuf, sb);
}

/* Test hook: COLLBENCH_ENGINE_CORRUPT_RANK=N makes rank N spoil the first element of each
 * validated result, so a test can prove that a wrong answer is caught and reported. */
static int corrupt_rank = -1;

/* Validation on separate calls: every rank checks every element, AND-reduced to pass/fail. */
static const char *run_validation(Coll *c)
{
    const OpDef *op = &OPS[c->step->op];
    if (!op->fill)
        return "off";
    /* rooted ops: a second root catches root mix-ups */
    int roots[2] = {c->step->root, (c->step->root + c->nranks - 1) % c->nranks};
    int nroots = op->rooted && c->nranks > 1 ? 2 : 1;
    long errors = 0;
    char first[512] = "";
    c->first_error = first;
    c->first_error_len = sizeof(first);
    for (int k = 0; k < nroots; k++) {
        op->fill(c, roots[k]);
        if (c->sendarg == MPI_IN_PLACE)
            place_input(c);
        MPI_Barrier(c->comm);
        op->call(c, roots[k]);
        if (corrupt_rank == c->rank && c->count)
            put_value(op->uses_recv ? c->recvbuf : c->sendbuf, c->step->dt, 0, -7); /* never valid */
        errors += op->check(c, roots[k]);
    }
    long total = 0;
    MPI_Allreduce(&errors, &total, 1, MPI_LONG, MPI_SUM, c->comm);
    if (errors) {
        fprintf(stderr, "collbench-engine: validation failed: %s %zu B %s: %ld bad elements on rank %d; %s\n",
                op->name, c->step->size, DATATYPES[c->step->dt].name, errors, c->rank, first);
        fflush(stderr);
    }
    return total ? "fail" : "pass";
}

static void print_record(const Step *s, const StepResult *r, int loop, int index, int nranks)
{
    char line[1024], pct[256] = "";
    if (r->have_pct)
        snprintf(pct, sizeof(pct), ",\"p50_us\":%.4f,\"p90_us\":%.4f,\"p99_us\":%.4f,\"pmax_us\":%.4f",
                 r->p50_us, r->p90_us, r->p99_us, r->pmax_us);
    int n = snprintf(line, sizeof(line),
                     "CBREC {\"op\":\"%s\",\"size_bytes\":%zu,\"datatype\":\"%s\",\"iterations\":%lld,"
                     "\"warmup\":%lld,\"avg_us\":%.4f,\"min_us\":%.4f,\"max_us\":%.4f,\"max_rank\":%d,"
                     "\"offcpu_rank\":%d,\"offcpu_max\":%.4f,\"offcpu_avg\":%.4f,"
                     "\"validation\":\"%s\",\"loop\":%d,\"step\":%d,\"t_start\":%.6f,\"t_end\":%.6f,"
                     "\"ranks\":%d,\"inplace\":%d,\"root\":%d,\"timing\":\"%s\"%s}\n",
                     OPS[s->op].name, s->size, DATATYPES[s->dt].name, s->iterations, s->warmup,
                     r->avg_us, r->min_us, r->max_us, r->max_rank, r->offcpu_rank, r->offcpu_max,
                     r->offcpu_avg, r->validation, loop, index,
                     r->t_start, r->t_end, nranks, s->inplace, s->root, TIMING_NAMES[s->timing], pct);
    /* one write per record: a reader never sees half a line */
    fwrite(line, 1, (size_t)n, stdout);
    fflush(stdout);
}

/* ------------------------------------------------------------------ main */

static void usage(FILE *f)
{
    fprintf(f, "usage: collbench-engine --plan FILE [--loop] [--validate] [--max-loops N] [--report-hosts] [--congestion SPEC]\n"
               "       collbench-engine --pairs --lat-size B --bw-size B --iterations N [--warmup N] [--concurrent]\n"
               "  plan lines: op size_bytes iterations warmup datatype [key=value ...]   (# comments)\n"
               "  keys: inplace=0|1 root=N timing=osu|sustained samples=0|1\n"
               "  ops: %s\n"
               "  datatypes: %s\n", op_names(), datatype_names());
}

/* ------------------------------------------------------------------ hosts and pairs */

/* s as a JSON string (host names are plain, but a record line must stay valid JSON). */
void json_string(char *out, size_t outlen, const char *s)
{
    size_t n = 0;
    if (outlen < 3)
        return;
    out[n++] = '"';
    for (; *s && n + 8 < outlen; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            n += (size_t)snprintf(out + n, outlen - n, "\\%c", ch);
        else if (ch < 0x20 || ch >= 0x7f)
            n += (size_t)snprintf(out + n, outlen - n, "\\u%04x", ch);
        else
            out[n++] = (char)ch;
    }
    out[n++] = '"';
    out[n] = '\0';
}

/* Rank 0 prints CBHOSTS {"hosts":[host of rank 0, host of rank 1, ...]}: where MPI (or the
 * scheduler) really placed each rank; and "slurm_job_id" when the ranks run in a Slurm job. */
static void print_hosts(int rank, int nranks)
{
    char name[MPI_MAX_PROCESSOR_NAME + 1];
    int len = 0;
    memset(name, 0, sizeof(name));
    MPI_Get_processor_name(name, &len);
    char *all = rank == 0 ? calloc((size_t)nranks, sizeof(name)) : NULL;
    MPI_Gather(name, (int)sizeof(name), MPI_CHAR, all, (int)sizeof(name), MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank != 0 || !all)
        return;
    size_t cap = (size_t)nranks * (sizeof(name) * 6 + 4) + 64, n = 0;
    char *line = malloc(cap), quoted[(MPI_MAX_PROCESSOR_NAME + 1) * 6 + 3];
    if (line) {
        n += (size_t)snprintf(line, cap, "CBHOSTS {\"hosts\":[");
        for (int i = 0; i < nranks; i++) {
            char *h = all + (size_t)i * sizeof(name);
            h[sizeof(name) - 1] = '\0';
            json_string(quoted, sizeof(quoted), h);
            n += (size_t)snprintf(line + n, cap - n, "%s%s", i ? "," : "", quoted);
        }
        /* the Slurm job the ranks run in (srun outside an allocation makes one): digits only */
        const char *job = getenv("SLURM_JOB_ID");
        int digits = job && *job && strlen(job) <= 20;
        for (const char *c = job; digits && *c; c++)
            digits = *c >= '0' && *c <= '9';
        if (digits)
            n += (size_t)snprintf(line + n, cap - n, "],\"slurm_job_id\":\"%s\"}\n", job);
        else
            n += (size_t)snprintf(line + n, cap - n, "]}\n");
        fwrite(line, 1, n, stdout);
        fflush(stdout);
        free(line);
    }
    free(all);
}

/* Partner of rank in round r of the circle method over m = P rounded up to even: rank m-1
 * stays, the others rotate. -1: a bye (P odd). */
static int round_partner(int rank, int r, int nranks)
{
    int m = nranks + (nranks & 1), last = m - 1, partner;
    if (rank == last)
        partner = r;
    else if (rank == r)
        partner = last;
    else
        partner = ((2 * r - rank) % last + last) % last;
    return partner >= nranks ? -1 : partner;
}

/* In one-pair-at-a-time mode, turn t of round r belongs to the t-th pair of the round counted
 * by lower rank; -1 when the round has fewer pairs (odd P). */
static int round_turn_owner(int r, int t, int nranks)
{
    int seen = 0;
    for (int q = 0; q < nranks; q++) {
        int p = round_partner(q, r, nranks);
        if (p > q && seen++ == t)
            return q;
    }
    return -1;
}

/* Half the round trip of `iterations` ping-pongs of `bytes` between me and peer, in seconds
 * (the lower rank of the pair starts). */
static double ping_pong(int me, int peer, char *buf, size_t bytes, long long warmup, long long iterations)
{
    double t0 = 0.0;
    for (long long i = 0; i < warmup + iterations; i++) {
        if (i == warmup)
            t0 = MPI_Wtime();
        if (me < peer) {
            MPI_Send(buf, (int)bytes, MPI_CHAR, peer, 7, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)bytes, MPI_CHAR, peer, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(buf, (int)bytes, MPI_CHAR, peer, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, (int)bytes, MPI_CHAR, peer, 7, MPI_COMM_WORLD);
        }
    }
    return (MPI_Wtime() - t0) / (2.0 * (double)iterations);
}

/* The distance matrix: CBPAIR {"a","b","round","lat_us","bw_bytes_per_s"} per pair (a < b). */
static int run_pairs(int rank, int nranks, size_t lat_size, size_t bw_size, long long iterations,
                     long long warmup, int concurrent)
{
    int m = nranks + (nranks & 1);
    size_t big = lat_size > bw_size ? lat_size : bw_size;
    char *buf = malloc(big ? big : 1);
    int failed = buf == NULL, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any)
        return EXIT_NO_MEMORY;
    memset(buf, 1, big ? big : 1);
    /* lower rank of each pair records; rank 0 gathers two P x P matrices */
    size_t cells = (size_t)nranks * (size_t)nranks;
    double *mine = calloc(cells * 3, sizeof(double)), *all = rank == 0 ? calloc(cells * 3, sizeof(double)) : NULL;
    failed = mine == NULL || (rank == 0 && all == NULL);
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any)
        return EXIT_NO_MEMORY;
    for (int r = 0; r < m - 1; r++) {
        int peer = round_partner(rank, r, nranks);
        /* one pair at a time: the pairs of a round take turns, ordered by their lower rank */
        int turns = concurrent ? 1 : m / 2;
        for (int t = 0; t < turns; t++) {
            MPI_Barrier(MPI_COMM_WORLD);
            int lower = peer < 0 ? -1 : (rank < peer ? rank : peer);
            int my_turn = peer >= 0 && (concurrent || lower == round_turn_owner(r, t, nranks));
            if (!my_turn)
                continue;
            double lat = ping_pong(rank, peer, buf, lat_size, warmup, iterations);
            double half = ping_pong(rank, peer, buf, bw_size, warmup > 2 ? warmup / 4 + 1 : warmup,
                                    iterations / 4 + 1);
            if (rank < peer) {
                size_t at = (size_t)rank * (size_t)nranks + (size_t)peer;
                mine[at] = lat * 1e6;
                mine[cells + at] = half > 0 ? (double)bw_size / half : 0.0;
                mine[2 * cells + at] = r;
            }
        }
    }
    MPI_Reduce(mine, all, (int)(cells * 3), MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        for (int a = 0; a < nranks; a++)
            for (int b = a + 1; b < nranks; b++) {
                size_t at = (size_t)a * (size_t)nranks + (size_t)b;
                printf("CBPAIR {\"a\":%d,\"b\":%d,\"round\":%d,\"lat_us\":%.4f,\"bw_bytes_per_s\":%.1f,"
                       "\"lat_size\":%zu,\"bw_size\":%zu,\"iterations\":%lld,\"concurrent\":%d}\n",
                       a, b, (int)all[2 * cells + at], all[at], all[cells + at], lat_size, bw_size,
                       iterations, concurrent);
            }
        fflush(stdout);
    }
    free(mine);
    free(all);
    free(buf);
    return 0;
}

/* Does this MPI take MPI_SUM on MPI_CHAR? Asked on a private communicator that returns
 * errors instead of aborting; every rank must agree. */
static int probe_char_sum(void)
{
    MPI_Comm probe;
    signed char in = 1, out = 0;
    int ok, all_ok = 0;
    MPI_Comm_dup(MPI_COMM_WORLD, &probe);
    MPI_Comm_set_errhandler(probe, MPI_ERRORS_RETURN);
    ok = MPI_Allreduce(&in, &out, 1, MPI_CHAR, MPI_SUM, probe) == MPI_SUCCESS;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Comm_free(&probe);
    return all_ok;
}

/* An MPI call failed (a forced algorithm refused, a peer gone). MPI's default handler prints the
 * error and then aborts through the process manager, and MPICH's Hydra may kill this rank's proxy
 * on that abort before the proxy has forwarded what the rank wrote to stderr: the job's stderr
 * then arrives empty (seen under load). Printed here and followed by a plain exit, the text goes
 * first: the proxy forwards a process's output before its exit status, on one connection. The
 * launcher then stops the other ranks (a rank ended without MPI_Finalize). */
static void on_mpi_error(MPI_Comm *comm, int *code, ...)
{
    char text[MPI_MAX_ERROR_STRING + 1];
    int len = 0, rank = -1;
    (void)comm;
    if (MPI_Error_string(*code, text, &len) != MPI_SUCCESS)
        len = 0;
    text[len] = '\0';
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "collbench-engine: rank %d: Fatal error in an MPI call: %s\n", rank,
            len ? text : "(MPI gave no error text)");
    fflush(stderr);
    fflush(stdout);
    _exit(EXIT_MPI_ERROR);
}

static int finish(int code)
{
    MPI_Finalize();
    return code;
}

int main(int argc, char **argv)
{
    int rank, nranks, loop_mode = 0, validate = 0, pairs = 0, concurrent = 0, report_hosts = 0;
    long long max_loops = 0, lat_size = 8, bw_size = 1 << 20, pair_iterations = 100, pair_warmup = 10;
    const char *plan_path = NULL, *congestion_spec = NULL;
    char msg[1024] = "";

    const char *corrupt = getenv("COLLBENCH_ENGINE_CORRUPT_RANK");
    if (corrupt && *corrupt)
        corrupt_rank = atoi(corrupt);
    install_signal_handlers();
    MPI_Init(&argc, &argv);
    {
        /* before any communicator is duplicated from world: the copies inherit it */
        MPI_Errhandler handler;
        MPI_Comm_create_errhandler(on_mpi_error, &handler);
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, handler);
        MPI_Errhandler_free(&handler);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    set_grace_note(rank);
    char_sum_ok = probe_char_sum();

    for (int i = 1; i < argc && !msg[0]; i++) {
        if (strcmp(argv[i], "--plan") == 0 && i + 1 < argc)
            plan_path = argv[++i];
        else if (strcmp(argv[i], "--loop") == 0)
            loop_mode = 1;
        else if (strcmp(argv[i], "--congestion") == 0 && i + 1 < argc)
            congestion_spec = argv[++i];
        else if (strcmp(argv[i], "--validate") == 0)
            validate = 1;
        else if (strcmp(argv[i], "--max-loops") == 0 && i + 1 < argc) {
            if (parse_long(argv[i + 1], 1, INT_MAX, &max_loops) < 0)
                snprintf(msg, sizeof(msg), "--max-loops: '%s' is not a whole number >= 1", argv[i + 1]);
            loop_mode = 1;
            i++;
        } else if (strcmp(argv[i], "--report-hosts") == 0)
            report_hosts = 1;
        else if (strcmp(argv[i], "--pairs") == 0)
            pairs = 1;
        else if (strcmp(argv[i], "--concurrent") == 0)
            concurrent = 1;
        else if ((strcmp(argv[i], "--lat-size") == 0 || strcmp(argv[i], "--bw-size") == 0
                  || strcmp(argv[i], "--iterations") == 0 || strcmp(argv[i], "--warmup") == 0)
                 && i + 1 < argc) {
            long long *dst = argv[i][2] == 'l' ? &lat_size : argv[i][2] == 'b' ? &bw_size
                           : argv[i][2] == 'i' ? &pair_iterations : &pair_warmup;
            long long lo = argv[i][2] == 'w' ? 0 : 1, hi = argv[i][2] == 'i' || argv[i][2] == 'w' ? 100000000 : INT_MAX;
            if (parse_long(argv[i + 1], lo, hi, dst) < 0)
                snprintf(msg, sizeof(msg), "%s: '%s' is not a whole number from %lld to %lld",
                         argv[i], argv[i + 1], lo, hi);
            i++;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            if (rank == 0)
                usage(stdout);
            return finish(0);
        } else
            snprintf(msg, sizeof(msg), "unknown or incomplete argument '%s'", argv[i]);
    }
    if (!msg[0] && !plan_path && !pairs)
        snprintf(msg, sizeof(msg), "--plan FILE (or --pairs) is required");
    if (!msg[0] && pairs && nranks < 2)
        snprintf(msg, sizeof(msg), "--pairs needs at least 2 ranks");
    if (msg[0]) {
        if (rank == 0) {
            fprintf(stderr, "collbench-engine: %s\n", msg);
            usage(stderr);
        }
        return finish(EXIT_BAD_INPUT);
    }
    if (pairs) {
        print_hosts(rank, nranks);
        return finish(run_pairs(rank, nranks, (size_t)lat_size, (size_t)bw_size, pair_iterations,
                                pair_warmup, concurrent));
    }

    Plan plan = {NULL, 0};
    char *text = read_plan_everywhere(plan_path, rank, msg, sizeof(msg));
    if (!text || parse_plan(text, plan_path, nranks, &plan, msg, sizeof(msg)) < 0) {
        if (rank == 0)
            fprintf(stderr, "collbench-engine: %s\n", msg);
        return finish(EXIT_BAD_INPUT);
    }
    free(text);
    if (report_hosts)
        print_hosts(rank, nranks);
    if (congestion_spec && cong_setup(congestion_spec, rank, nranks) < 0)
        return finish(EXIT_BAD_INPUT);

    /* one allocation for the largest step, page-aligned and touched, as OSU does */
    size_t max_send = 0, max_recv = 0;
    for (int i = 0; i < plan.nsteps; i++) {
        const OpDef *op = &OPS[plan.steps[i].op];
        size_t sb = send_bytes(op, plan.steps[i].size, nranks);
        size_t rb = recv_bytes(op, plan.steps[i].size, nranks);
        max_send = sb > max_send ? sb : max_send;
        max_recv = rb > max_recv ? rb : max_recv;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    Coll c;
    memset(&c, 0, sizeof(c));
    c.comm = MPI_COMM_WORLD;
    c.rank = rank;
    c.nranks = nranks;
    int alloc_failed = posix_memalign(&c.sendbuf, page, max_send ? max_send : page) != 0
                    || posix_memalign(&c.recvbuf, page, max_recv ? max_recv : page) != 0
                    || !(c.recvcounts = malloc(sizeof(int) * (size_t)nranks));
    int any_failed = 0;
    MPI_Allreduce(&alloc_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any_failed) {
        if (alloc_failed)
            fprintf(stderr, "collbench-engine: rank %d cannot allocate %zu + %zu bytes for the plan's "
                    "largest step\n", rank, max_send, max_recv);
        return finish(EXIT_NO_MEMORY);
    }
    touch_buffers(&c, max_send, max_recv);

    /* every rank talks to every other once before timing, so connection set-up never lands in a
     * step (OSU pays it in its first size's warm-up, which the averages never see either) */
    int *hello = malloc(sizeof(int) * (size_t)nranks);
    if (hello) {
        for (int i = 0; i < nranks; i++)
            hello[i] = rank;
        MPI_Alltoall(MPI_IN_PLACE, 1, MPI_INT, hello, 1, MPI_INT, MPI_COMM_WORLD);
        free(hello);
    }

    int validation_failed = 0, stop = 0;
    for (int loop = 0; !stop && (loop == 0 || (loop_mode && (!max_loops || loop < max_loops))); loop++) {
        for (int i = 0; i < plan.nsteps && !stop; i++) {
            const Step *s = &plan.steps[i];
            const OpDef *op = &OPS[s->op];
            StepResult r;
            setup_coll(&c, s);
            cong_before_step(validate);  /* the host's counters, outside the timed region */
            run_timed(&c, &r);
            cong_after_step(rank, loop, i);
            r.validation = "off";
            if (validate) {
                r.validation = run_validation(&c);
                if (strcmp(r.validation, "fail") == 0)
                    validation_failed = 1;
                touch_buffers(&c, send_bytes(op, s->size, nranks), recv_bytes(op, s->size, nranks));
            }
            if (rank == 0)
                print_record(s, &r, loop, i, nranks);
            /* a stop signal may reach some ranks only: agree before the next collective */
            int mine = stop_signal != 0;
            MPI_Allreduce(&mine, &stop, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        }
    }
    if (stop && rank == 0) {
        fprintf(stderr, "collbench-engine: stop requested, exiting after the step in progress\n");
        fflush(stderr);
    }
    free(c.sendbuf);
    free(c.recvbuf);
    free(c.recvcounts);
    free(plan.steps);
    return finish(validation_failed ? EXIT_VALIDATION : 0);
}
