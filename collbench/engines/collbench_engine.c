/*
 * collbench-engine: the built-in MPI collective benchmark (one C99 source).
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
 * each host during the step (see "congestion counters" below).
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

#define EXIT_VALIDATION 1
#define EXIT_BAD_INPUT 2
#define EXIT_NO_MEMORY 3
#define EXIT_MPI_ERROR 4
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
static char *read_bounded(FILE *f, size_t limit, size_t *len)
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

/* First SIGTERM/SIGINT: finish the step in progress (its record is printed whole), agree at
 * the step boundary and exit 0. A second one: die at once. */
static void on_stop_signal(int sig)
{
    if (stop_signal) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    stop_signal = sig;
}

static void install_signal_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
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

static double wall_clock(void)
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

static double thread_cpu(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return -1.0;
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
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
    double cpu0 = thread_cpu();
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
    double cpu1 = thread_cpu();
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
    /* the rank the others waited for, after the timed figures: the share of the loop's wall time
     * each rank's thread spent off its CPU (descheduled: a CPU hog, a cgroup quota, throttling).
     * MPI ranks poll while they wait, so a healthy rank stays on its CPU; the rank with the
     * largest time per call (max_rank) is usually one that waited for the late one, and the
     * smallest (a MINLOC) is too often the op's structure to name it (docs/DIAGNOSIS.md) */
    double wall = r->t_end - r->t_start, offsum = 0.0;
    double off = cpu0 < 0 || cpu1 < 0 || wall <= 0 ? 0.0 : 1.0 - (cpu1 - cpu0) / wall;
    struct { double value; int rank; } offmine = {off < 0 ? 0.0 : off, c->rank}, offworst = {0.0, 0};
    MPI_Reduce(&offmine, &offworst, 1, MPI_DOUBLE_INT, MPI_MAXLOC, 0, c->comm);
    MPI_Reduce(&offmine.value, &offsum, 1, MPI_DOUBLE, MPI_SUM, 0, c->comm);
    r->offcpu_rank = offworst.rank;
    r->offcpu_max = offworst.value;
    r->offcpu_avg = offsum / c->nranks;
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

/* ------------------------------------------------------------------ congestion counters
 *
 * --congestion SPEC: the lowest rank of each host reads that host's congestion counters
 * immediately before and after each step's timed loop (outside the timed region), and rank 0
 * prints, before the step's CBREC line, one line
 *   CBCONG {"loop":L,"step":S,"t0":wall,"t1":wall,"hosts":{"HOST":{"dt":s,"n":read,"src":sources,
 *           "f":[vanished,unreadable,backwards,garbage],"drop":k,"us":snapshot µs,"r":reader's rank,
 *           "d":{"counter@where":delta,...}},...}}
 * with only the counters that moved (at most CONG_MAX_MOVED per host, the largest; the rest in
 * "drop"). Which counters, and where each host reads them, is the SPEC file Python writes from
 * its one table (collbench/congestion/sources.py spec_text): this code knows no counter names.
 * Without --validate a step's after-snapshot is the next step's before (cong_before_step).
 * Faults follow collbench/congestion/deltas.py: a counter that vanished, cannot be read, went
 * backwards or holds garbage is skipped and counted, never a negative delta, never a failed step.
 * Test hook: COLLBENCH_ENGINE_HOST_OF_RANK="hA,hA,hB,hB" names each world rank's host (several
 * emulated hosts on one machine); otherwise MPI_Get_processor_name.
 */
#include <dirent.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/statfs.h>
#include <sys/socket.h>
#include <netinet/in.h>

static void json_string(char *out, size_t outlen, const char *s);   /* hosts and pairs, below */

#define CONG_MAX_SPEC (256 * 1024)
#define CONG_MAX_NAMES 512
#define CONG_MAX_NAME 64
#define CONG_MAX_PATH 1024
#define CONG_MAX_NETDEVS 16
#define CONG_MAX_SAMPLES 4096
#define CONG_MAX_KEY 160
#define CONG_MAX_MOVED 32
#define CONG_MAX_DIRS 64
#define CONG_SYSFS_MAGIC 0x62656572
#define CONG_LAYOUT_SECONDS 10.0  /* directories and netdevs listed again at least this often */
#define CONG_MAX_FILE (1 << 20)
#define CONG_HOST_LEN (MPI_MAX_PROCESSOR_NAME + 1)
enum { CONG_OK = 0, CONG_UNREADABLE = 1, CONG_GARBAGE = 2 };
enum { CF_VANISHED, CF_UNREADABLE, CF_BACKWARDS, CF_GARBAGE, CF_N };
enum { CS_HW, CS_PORT, CS_ETH, CS_IPEXT, CS_TCPEXT, CS_N };

typedef struct {
    char key[CONG_MAX_KEY];
    unsigned long long value;
    int fault;
} CongSample;

typedef struct {
    CongSample *s;
    int n;
    double wall, mono;
    int sources;
} CongSnap;

typedef struct {                    /* a netdev's ETH_SS_STATS layout, kept while its count holds */
    char name[16];
    unsigned n_stats;
    int nkept;
    int *kept;                      /* indices of the wanted statistics */
    int *kept_name;                 /* their index in names[CS_ETH] */
} CongEth;

typedef struct {
    int enabled, reader, rank;      /* reader: the lowest rank of this host; rank: in world */
    MPI_Comm leaders;               /* one rank per host; MPI_COMM_NULL on the others */
    char host[CONG_HOST_LEN];
    char sysfs_root[CONG_MAX_PATH], netstat[CONG_MAX_PATH], ethtool_root[CONG_MAX_PATH];
    char netdevs[CONG_MAX_NETDEVS][16];
    int nnetdevs;
    char (*names[CS_N])[CONG_MAX_NAME];
    int nnames[CS_N];
    CongSnap before, after;
    int sock;
    CongEth eth[CONG_MAX_NETDEVS];
    int neth;
    double snap_us;                 /* what the last snapshot cost (bench/congestion_overhead.py) */
    int have_after;                 /* the last after-snapshot can be the next step's before */
    struct { int fd; char where[CONG_MAX_KEY]; int set; int *held; } dirs[CONG_MAX_DIRS];
    int ndirs, layout_stale;        /* the counter directories, open */
    double layout_at;
    char netdev_list[CONG_MAX_NETDEVS][16];
    int nnetdev_list;
} Cong;

static Cong cong;

static double cong_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A counter's value: decimal digits (surrounding blanks allowed), at most 2^64-1. */
static int cong_parse_value(const char *p, const char *end, unsigned long long *out)
{
    unsigned long long v = 0;
    int digits = 0;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    for (; p < end && *p >= '0' && *p <= '9'; p++, digits++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (ULLONG_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    if (!digits || p != end)
        return -1;
    *out = v;
    return 0;
}

static void cong_add(CongSnap *sn, const char *name, const char *where, unsigned long long v, int fault)
{
    if (sn->n >= CONG_MAX_SAMPLES)
        return;
    CongSample *x = &sn->s[sn->n];
    size_t ln = strlen(name), lw = strlen(where);
    if (ln + 1 + lw >= sizeof(x->key))
        return;
    memcpy(x->key, name, ln);           /* "name@where" (snprintf costs more than the read) */
    x->key[ln] = '@';
    memcpy(x->key + ln + 1, where, lw + 1);
    x->value = v;
    x->fault = fault;
    sn->n++;
}

static int cong_cmp_name(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* `name` in names[set] (sorted by cong_load_spec), or -1. */
static int cong_name_index(int set, const char *name)
{
    const char (*hit)[CONG_MAX_NAME] = bsearch(name, cong.names[set], (size_t)cong.nnames[set], CONG_MAX_NAME,
                                               cong_cmp_name);
    return hit ? (int)(hit - cong.names[set]) : -1;
}

/* "name" of the spec into names[set] (space-separated tokens after the line's keyword). */
static void cong_add_name(int set, const char *tok)
{
    if (cong.nnames[set] >= CONG_MAX_NAMES || strlen(tok) >= CONG_MAX_NAME)
        return;
    snprintf(cong.names[set][cong.nnames[set]++], CONG_MAX_NAME, "%s", tok);
}

/* "defaults|host NAME sysfs_root P netstat P [ethtool_root P] [netdev N]...": this host's sources. */
static void cong_apply_sources(char **tok, int ntok)
{
    cong.ethtool_root[0] = '\0';
    cong.nnetdevs = 0;
    for (int i = 0; i + 1 < ntok; i += 2) {
        if (strcmp(tok[i], "sysfs_root") == 0)
            snprintf(cong.sysfs_root, sizeof(cong.sysfs_root), "%s", tok[i + 1]);
        else if (strcmp(tok[i], "netstat") == 0)
            snprintf(cong.netstat, sizeof(cong.netstat), "%s", tok[i + 1]);
        else if (strcmp(tok[i], "ethtool_root") == 0)
            snprintf(cong.ethtool_root, sizeof(cong.ethtool_root), "%s", tok[i + 1]);
        else if (strcmp(tok[i], "netdev") == 0 && cong.nnetdevs < CONG_MAX_NETDEVS && strlen(tok[i + 1]) < 16)
            snprintf(cong.netdevs[cong.nnetdevs++], 16, "%.15s", tok[i + 1]);
    }
}

/* Parse the spec (every rank has its text): names, and this host's sources (its `host` line,
 * else `defaults`). Lines are split in place; tokens are space-separated. */
static int cong_load_spec(char *text)
{
    char *save = NULL, *tok[4 + 4 * CONG_MAX_NETDEVS + 2 * CONG_MAX_NAMES];
    int have_host = 0;
    for (int s = 0; s < CS_N; s++) {
        cong.names[s] = calloc(CONG_MAX_NAMES, CONG_MAX_NAME);
        if (!cong.names[s])
            return -1;
    }
    snprintf(cong.sysfs_root, sizeof(cong.sysfs_root), "/sys");
    snprintf(cong.netstat, sizeof(cong.netstat), "/proc/net/netstat");
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int ntok = 0;
        char *s2 = NULL;
        if (line[0] == '#')
            continue;
        for (char *t = strtok_r(line, " \t\r", &s2); t && ntok < (int)(sizeof(tok) / sizeof(tok[0]));
             t = strtok_r(NULL, " \t\r", &s2))
            tok[ntok++] = t;
        if (ntok == 0)
            continue;
        if (strcmp(tok[0], "defaults") == 0 && !have_host)
            cong_apply_sources(tok + 1, ntok - 1);
        else if (strcmp(tok[0], "host") == 0 && ntok > 1 && strcmp(tok[1], cong.host) == 0) {
            cong_apply_sources(tok + 2, ntok - 2);
            have_host = 1;
        } else if (strcmp(tok[0], "rdma_hw") == 0 || strcmp(tok[0], "rdma_port") == 0
                   || strcmp(tok[0], "ethtool") == 0) {
            int set = tok[0][0] == 'e' ? CS_ETH : tok[0][5] == 'h' ? CS_HW : CS_PORT;
            for (int i = 1; i < ntok; i++)
                cong_add_name(set, tok[i]);
        } else if (strcmp(tok[0], "netstat") == 0 && ntok > 1) {
            int set = strcmp(tok[1], "IpExt") == 0 ? CS_IPEXT : strcmp(tok[1], "TcpExt") == 0 ? CS_TCPEXT : -1;
            for (int i = 2; set >= 0 && i < ntok; i++)
                cong_add_name(set, tok[i]);
        } else if (strcmp(tok[0], "defaults") != 0 && strcmp(tok[0], "host") != 0)
            return -1;
    }
    for (int s = 0; s < CS_N; s++)      /* looked up by bsearch (cong_name_index) */
        qsort(cong.names[s], (size_t)cong.nnames[s], CONG_MAX_NAME, cong_cmp_name);
    return 0;
}

/* ---- readers: each adds samples (value or fault) and returns 1 when its source answered */

/* The counter directories (<sysfs>/class/infiniband/<dev>/ports/<port>/{hw_counters,counters}),
 * opened once: a snapshot is then one openat/read/close per counter name, resolved in its
 * directory (a counter that vanishes and comes back is seen at once). Listed again every
 * CONG_LAYOUT_SECONDS and when a whole directory has gone. */
static void cong_add_dir(const char *path, const char *where, int set)
{
    if (cong.ndirs >= CONG_MAX_DIRS)
        return;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    int *held = malloc(sizeof(int) * (size_t)(cong.nnames[set] + 1));
    if (!held) {
        close(fd);
        return;
    }
    /* A counter file on sysfs stays open and is read with pread at offset 0 (kernfs shows the
     * value afresh there): one syscall per counter. Any other file (a fixture tree, which a test
     * replaces or removes) is opened by name on every read. */
    for (int j = 0; j < cong.nnames[set]; j++) {
        struct statfs fs;
        held[j] = openat(fd, cong.names[set][j], O_RDONLY | O_CLOEXEC);
        if (held[j] >= 0 && (fstatfs(held[j], &fs) != 0 || fs.f_type != CONG_SYSFS_MAGIC)) {
            close(held[j]);
            held[j] = -1;
        }
    }
    cong.dirs[cong.ndirs].fd = fd;
    cong.dirs[cong.ndirs].set = set;
    cong.dirs[cong.ndirs].held = held;
    snprintf(cong.dirs[cong.ndirs].where, CONG_MAX_KEY, "%s", where);
    cong.ndirs++;
}

static int cong_list_netdevs(char out[][16], int max);

/* The RDMA devices under <sysfs_root>/class/infiniband, one name a call: *devs is NULL before
 * the first; at the end NULL, the directory closed (the layout and the netdev list walk them). */
static const char *cong_next_rdma_dev(DIR **devs)
{
    if (!*devs) {
        char path[CONG_MAX_PATH * 2];
        snprintf(path, sizeof(path), "%s/class/infiniband", cong.sysfs_root);
        if (!(*devs = opendir(path)))
            return NULL;
    }
    struct dirent *dev;
    while ((dev = readdir(*devs)))
        if (dev->d_name[0] != '.')
            return dev->d_name;
    closedir(*devs);
    *devs = NULL;
    return NULL;
}

static void cong_build_layout(void)
{
    for (int i = 0; i < cong.ndirs; i++) {
        for (int j = 0; j < cong.nnames[cong.dirs[i].set]; j++)
            if (cong.dirs[i].held[j] >= 0)
                close(cong.dirs[i].held[j]);
        free(cong.dirs[i].held);
        close(cong.dirs[i].fd);
    }
    cong.ndirs = 0;
    char path[CONG_MAX_PATH * 2], where[CONG_MAX_KEY];
    DIR *devs = NULL;
    const char *dev;
    while ((dev = cong_next_rdma_dev(&devs))) {
        snprintf(path, sizeof(path), "%s/class/infiniband/%s/ports", cong.sysfs_root, dev);
        DIR *ports = opendir(path);
        struct dirent *port;
        while (ports && (port = readdir(ports))) {
            if (port->d_name[0] == '.')
                continue;
            snprintf(where, sizeof(where), "%.64s/%.16s", dev, port->d_name);
            snprintf(path, sizeof(path), "%s/class/infiniband/%s/ports/%s/hw_counters", cong.sysfs_root,
                     dev, port->d_name);
            cong_add_dir(path, where, CS_HW);
            snprintf(path, sizeof(path), "%s/class/infiniband/%s/ports/%s/counters", cong.sysfs_root,
                     dev, port->d_name);
            cong_add_dir(path, where, CS_PORT);
        }
        if (ports)
            closedir(ports);
    }
    cong.nnetdev_list = cong_list_netdevs(cong.netdev_list, CONG_MAX_NETDEVS);
    cong.layout_stale = 0;
    cong.layout_at = cong_mono();
}

static int cong_read_rdma(CongSnap *sn)
{
    char buf[72];
    for (int i = 0; i < cong.ndirs; i++) {
        int set = cong.dirs[i].set;
        const char *where = cong.dirs[i].where;
        int absent = 0;
        for (int j = 0; j < cong.nnames[set]; j++) {
            const char *name = cong.names[set][j];
            int held = cong.dirs[i].held[j];
            if (held >= 0) {
                ssize_t n = pread(held, buf, sizeof(buf) - 1, 0);
                unsigned long long v;
                if (n < 0 && (errno == ENODEV || errno == ENOENT)) {
                    absent++;                /* the device went away: vanished */
                    cong.layout_stale = 1;
                } else if (n < 0)
                    cong_add(sn, name, where, 0, CONG_UNREADABLE);
                else if (cong_parse_value(buf, buf + n, &v) < 0)
                    cong_add(sn, name, where, 0, CONG_GARBAGE);
                else
                    cong_add(sn, name, where, v, CONG_OK);
                continue;
            }
            int fd = openat(cong.dirs[i].fd, name, O_RDONLY | O_CLOEXEC);
            if (fd < 0) {
                if (errno == ENOENT)
                    absent++;                /* not there (deltas count one that vanished) */
                else
                    cong_add(sn, name, where, 0, CONG_UNREADABLE);
                continue;
            }
            ssize_t n = read(fd, buf, sizeof(buf) - 1);
            close(fd);
            unsigned long long v;
            if (n < 0)
                cong_add(sn, name, where, 0, CONG_UNREADABLE);
            else if (cong_parse_value(buf, buf + n, &v) < 0)
                cong_add(sn, name, where, 0, CONG_GARBAGE);
            else
                cong_add(sn, name, where, v, CONG_OK);
        }
        if (absent == cong.nnames[set])
            cong.layout_stale = 1;           /* the directory went away (a device or port removed) */
    }
    return cong.ndirs;
}

/* The whole file (at most CONG_MAX_FILE bytes) in a buffer kept between calls, NUL-terminated;
 * NULL when it cannot be read. Not to be freed: the next call reuses it. */
static char *cong_read_file(const char *path, size_t *len)
{
    static char *buf;
    static size_t cap;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t n = 0;
    for (;;) {
        if (n + 1 >= cap) {
            size_t grown = cap ? cap * 2 : 16384;
            char *b = grown <= CONG_MAX_FILE + 1 ? realloc(buf, grown) : NULL;
            if (!b)
                break;
            buf = b;
            cap = grown;
        }
        ssize_t got = read(fd, buf + n, cap - n - 1);
        if (got < 0) {
            close(fd);
            return NULL;
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    close(fd);
    if (!buf)
        return NULL;
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int cong_eth_index(const char *name)
{
    return cong_name_index(CS_ETH, name);
}

/* `ethtool -S` text (a fixture tree: one file per netdev): "name: value" lines. */
static int cong_read_ethtool_file(CongSnap *sn, const char *netdev)
{
    char path[CONG_MAX_PATH * 2];
    size_t len = 0;
    snprintf(path, sizeof(path), "%s/%s", cong.ethtool_root, netdev);
    char *text = cong_read_file(path, &len);
    if (!text)
        return 0;
    for (char *line = text; line < text + len;) {
        char *end = memchr(line, '\n', (size_t)(text + len - line));
        if (!end)
            end = text + len;
        *end = '\0';
        char *name = line;
        while (*name == ' ' || *name == '\t')
            name++;
        char *colon = (name[0] == 'r' || name[0] == 't') ? strchr(name, ':') : NULL;  /* rx_* / tx_* only */
        line = end + 1;
        if (!colon)
            continue;
        *colon = '\0';
        if (cong_eth_index(name) < 0)
            continue;
        unsigned long long v;
        if (cong_parse_value(colon + 1, end, &v) < 0)
            cong_add(sn, name, netdev, 0, CONG_GARBAGE);
        else
            cong_add(sn, name, netdev, v, CONG_OK);
    }
    return 1;
}

/* SIOCETHTOOL (what `ethtool -S` uses); the layouts of linux/ethtool.h, written out so the engine
 * needs no kernel headers. */
#define CONG_SIOCETHTOOL 0x8946
#define CONG_GSTRINGS 0x1b
#define CONG_GSTATS 0x1d
#define CONG_GSSET_INFO 0x37
#define CONG_SS_STATS 1

static int cong_ethtool_ioctl(const char *netdev, void *data)
{
    struct { char name[16]; void *data; char pad[24]; } ifr;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.name, sizeof(ifr.name), "%.15s", netdev);
    ifr.data = data;
    if (cong.sock < 0)
        cong.sock = socket(AF_INET, SOCK_DGRAM, 0);
    return cong.sock < 0 ? -1 : ioctl(cong.sock, CONG_SIOCETHTOOL, &ifr);
}

static CongEth *cong_eth_layout(const char *netdev, unsigned n_stats)
{
    CongEth *e = NULL;
    for (int i = 0; i < cong.neth; i++)
        if (strcmp(cong.eth[i].name, netdev) == 0)
            e = &cong.eth[i];
    if (e && e->n_stats == n_stats)
        return e;
    if (!e) {
        if (cong.neth >= CONG_MAX_NETDEVS)
            return NULL;
        e = &cong.eth[cong.neth++];
        memset(e, 0, sizeof(*e));
        snprintf(e->name, sizeof(e->name), "%.15s", netdev);
    }
    free(e->kept);
    free(e->kept_name);
    e->kept = e->kept_name = NULL;
    e->nkept = 0;
    e->n_stats = 0;
    unsigned char *buf = calloc(1, 12 + (size_t)n_stats * 32);
    if (!buf)
        return NULL;
    uint32_t hdr[3] = {CONG_GSTRINGS, CONG_SS_STATS, n_stats};
    memcpy(buf, hdr, sizeof(hdr));
    if (cong_ethtool_ioctl(netdev, buf) < 0 || ((uint32_t *)buf)[2] != n_stats
        || !(e->kept = malloc(sizeof(int) * n_stats)) || !(e->kept_name = malloc(sizeof(int) * n_stats))) {
        free(buf);
        return NULL;
    }
    for (unsigned i = 0; i < n_stats; i++) {
        char name[33];
        memcpy(name, buf + 12 + (size_t)i * 32, 32);
        name[32] = '\0';
        int k = cong_eth_index(name);
        if (k >= 0) {
            e->kept[e->nkept] = (int)i;
            e->kept_name[e->nkept++] = k;
        }
    }
    free(buf);
    e->n_stats = n_stats;
    return e;
}

static int cong_read_ethtool_ioctl(CongSnap *sn, const char *netdev)
{
    uint32_t info[5] = {CONG_GSSET_INFO, 0, 1u << CONG_SS_STATS, 0, 0};   /* cmd, reserved, mask(u64), data[0] */
    if (cong_ethtool_ioctl(netdev, info) < 0)
        return 0;
    unsigned n = info[4];
    if (!(info[2] & (1u << CONG_SS_STATS)) || n == 0 || n > (1u << 20))
        return 0;
    CongEth *e = cong_eth_layout(netdev, n);
    if (!e)
        return 0;
    uint64_t *buf = calloc(1 + n, sizeof(uint64_t));
    if (!buf)
        return 0;
    uint32_t hdr[2] = {CONG_GSTATS, n};
    memcpy(buf, hdr, sizeof(hdr));
    int ok = cong_ethtool_ioctl(netdev, buf) == 0 && ((uint32_t *)buf)[1] == n;
    if (ok)
        for (int i = 0; i < e->nkept; i++)
            cong_add(sn, cong.names[CS_ETH][e->kept_name[i]], netdev, buf[1 + e->kept[i]], CONG_OK);
    else
        e->n_stats = 0;     /* the driver changed: read the names again next time */
    free(buf);
    return ok;
}

/* The netdevs to read: the spec's, else the files of ethtool_root, else the RDMA devices' netdevs. */
static int cong_list_netdevs(char out[][16], int max)
{
    int n = 0;
    for (int i = 0; i < cong.nnetdevs && n < max; i++)
        snprintf(out[n++], 16, "%.15s", cong.netdevs[i]);
    if (n)
        return n;
    char path[CONG_MAX_PATH * 2];
    if (cong.ethtool_root[0]) {
        DIR *d = opendir(cong.ethtool_root);
        struct dirent *e;
        while (d && (e = readdir(d)) && n < max)
            if (e->d_name[0] != '.' && strlen(e->d_name) < 16)
                snprintf(out[n++], 16, "%.15s", e->d_name);
        if (d)
            closedir(d);
        return n;
    }
    DIR *devs = NULL;
    const char *dev;
    while ((dev = cong_next_rdma_dev(&devs))) {
        snprintf(path, sizeof(path), "%s/class/infiniband/%s/device/net", cong.sysfs_root, dev);
        DIR *nets = opendir(path);
        struct dirent *net;
        while (nets && (net = readdir(nets)) && n < max) {
            int dup = 0;
            for (int i = 0; i < n; i++)
                dup |= strcmp(out[i], net->d_name) == 0;
            if (net->d_name[0] != '.' && !dup && strlen(net->d_name) < 16)
                snprintf(out[n++], 16, "%.15s", net->d_name);
        }
        if (nets)
            closedir(nets);
    }
    return n;
}

/* One section of netstat text: the header line "Sec: a b c" and the value line "Sec: 1 2 3". */
static void cong_netstat_section(CongSnap *sn, char *text, const char *section, int set)
{
    size_t sl = strlen(section);
    char *header = NULL, *values = NULL;
    for (char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, section, sl) == 0 && p[sl] == ':') {
            if (!header)
                header = p;
            else {
                values = p;
                break;
            }
        }
    }
    if (!header || !values)
        return;
    /* walk both lines token by token */
    char *h = header + sl + 1, *v = values + sl + 1;
    for (;;) {
        while (*h == ' ')
            h++;
        while (*v == ' ')
            v++;
        if (*h == '\n' || !*h || *v == '\n' || !*v)
            break;
        char *he = h, *ve = v;
        while (*he && *he != ' ' && *he != '\n')
            he++;
        while (*ve && *ve != ' ' && *ve != '\n')
            ve++;
        char name[CONG_MAX_NAME];
        size_t hl = (size_t)(he - h);
        if (hl < sizeof(name)) {
            memcpy(name, h, hl);
            name[hl] = '\0';
            if (cong_name_index(set, name) >= 0) {
                unsigned long long x;
                if (cong_parse_value(v, ve, &x) < 0)
                    cong_add(sn, name, "netstat", 0, CONG_GARBAGE);
                else
                    cong_add(sn, name, "netstat", x, CONG_OK);
            }
        }
        h = he;
        v = ve;
    }
}

static int cong_read_netstat(CongSnap *sn)
{
    size_t len = 0;
    if (!cong.nnames[CS_IPEXT] && !cong.nnames[CS_TCPEXT])
        return 0;                        /* not a TCP transport: the spec names none */
    char *text = cong_read_file(cong.netstat, &len);
    if (!text)
        return 0;
    cong_netstat_section(sn, text, "IpExt", CS_IPEXT);
    cong_netstat_section(sn, text, "TcpExt", CS_TCPEXT);
    return 1;
}

static int cong_cmp_key(const void *a, const void *b)
{
    return strcmp(((const CongSample *)a)->key, ((const CongSample *)b)->key);
}

static void cong_snapshot(CongSnap *sn)
{
    sn->n = 0;
    sn->wall = wall_clock();
    sn->mono = cong_mono();
    if (cong.layout_stale || sn->mono - cong.layout_at >= CONG_LAYOUT_SECONDS || cong.layout_at == 0.0)
        cong_build_layout();
    sn->sources = cong_read_rdma(sn);
    for (int i = 0; i < cong.nnetdev_list; i++)
        sn->sources += cong.ethtool_root[0] ? cong_read_ethtool_file(sn, cong.netdev_list[i])
                                            : cong_read_ethtool_ioctl(sn, cong.netdev_list[i]);
    sn->sources += cong_read_netstat(sn);
}

/* ---- set-up, the step's two snapshots, the gathered line */

/* Every rank: its host's name and whether it is the host's reader; the readers' communicator. */
static int cong_setup(const char *spec_path, int rank, int nranks)
{
    char msg[512] = "";
    long long len = -1;
    char *text = NULL;
    if (rank == 0) {
        size_t n = 0;
        FILE *f = fopen(spec_path, "r");
        text = f ? read_bounded(f, CONG_MAX_SPEC + 1, &n) : NULL;
        if (!f)
            snprintf(msg, sizeof(msg), "cannot read congestion spec %s: %s", spec_path, strerror(errno));
        else if (!text || ferror(f) || n > CONG_MAX_SPEC || memchr(text, '\0', n))
            snprintf(msg, sizeof(msg), "congestion spec %s: unreadable, larger than %d bytes or not text",
                     spec_path, CONG_MAX_SPEC);
        else
            len = (long long)n;
        if (f)
            fclose(f);
    }
    MPI_Bcast(&len, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    if (len < 0) {
        if (rank == 0)
            fprintf(stderr, "collbench-engine: %s\n", msg);
        free(text);
        return -1;
    }
    if (rank != 0 && !(text = malloc((size_t)len + 1)))
        MPI_Abort(MPI_COMM_WORLD, EXIT_NO_MEMORY);
    MPI_Bcast(text, (int)len, MPI_CHAR, 0, MPI_COMM_WORLD);
    text[len] = '\0';

    memset(cong.host, 0, sizeof(cong.host));
    const char *names = getenv("COLLBENCH_ENGINE_HOST_OF_RANK");
    if (names && *names) {          /* test hook: the rank-th comma-separated name */
        const char *p = names;
        for (int r = 0; r < rank && p; r++)
            p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL;
        size_t l = p ? strcspn(p, ",") : 0;
        snprintf(cong.host, sizeof(cong.host), "%.*s", (int)(l < CONG_HOST_LEN - 1 ? l : CONG_HOST_LEN - 1),
                 p ? p : "");
    }
    if (!cong.host[0]) {
        int hl = 0;
        MPI_Get_processor_name(cong.host, &hl);
    }
    char *all = malloc((size_t)nranks * CONG_HOST_LEN);
    if (!all)
        MPI_Abort(MPI_COMM_WORLD, EXIT_NO_MEMORY);
    MPI_Allgather(cong.host, CONG_HOST_LEN, MPI_CHAR, all, CONG_HOST_LEN, MPI_CHAR, MPI_COMM_WORLD);
    int first = rank;
    for (int r = 0; r < rank; r++)
        if (strncmp(all + (size_t)r * CONG_HOST_LEN, cong.host, CONG_HOST_LEN) == 0) {
            first = r;
            break;
        }
    free(all);
    cong.reader = first == rank;
    cong.rank = rank;
    MPI_Comm_split(MPI_COMM_WORLD, cong.reader ? 0 : MPI_UNDEFINED, rank, &cong.leaders);
    int bad = cong_load_spec(text) < 0, any_bad = 0;
    free(text);
    MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any_bad) {
        if (rank == 0)
            fprintf(stderr, "collbench-engine: congestion spec %s: a line that is not "
                            "defaults/host/rdma_hw/rdma_port/ethtool/netstat\n", spec_path);
        return -1;
    }
    cong.sock = -1;
    if (cong.reader && (!(cong.before.s = malloc(sizeof(CongSample) * CONG_MAX_SAMPLES))
                        || !(cong.after.s = malloc(sizeof(CongSample) * CONG_MAX_SAMPLES))))
        MPI_Abort(MPI_COMM_WORLD, EXIT_NO_MEMORY);
    cong.enabled = 1;
    return 0;
}

/* The step's before-snapshot. After a step whose only untimed work was bookkeeping (its record,
 * the stop check: no validation calls), its after-snapshot serves as the next step's before: one
 * snapshot per step instead of two, and the window still holds only the steps' own traffic. */
static void cong_before_step(int fresh)
{
    if (!cong.enabled || !cong.reader)
        return;
    if (cong.have_after && !fresh) {
        CongSnap t = cong.before;
        cong.before = cong.after;
        cong.after = t;
    } else
        cong_snapshot(&cong.before);
    cong.have_after = 0;
}

typedef struct { const char *key; unsigned long long d; } CongMoved;

static int cong_cmp_moved(const void *a, const void *b)
{
    const CongMoved *x = a, *y = b;
    return x->d < y->d ? 1 : x->d > y->d ? -1 : strcmp(x->key, y->key);
}

/* This host's fragment: "HOST":{"dt":..,"n":..,"src":..,"f":[..],"drop":..,"d":{...}} */
static char *cong_fragment(int *len)
{
    CongSnap *b = &cong.before, *a = &cong.after;
    int faults[CF_N] = {0}, read = 0, nmoved = 0, same = b->n == a->n;
    /* both snapshots walk the same layout: the keys are in the same order unless a counter came
     * or went; only then sort them for the merge */
    for (int k = 0; same && k < b->n; k++)
        same = strcmp(b->s[k].key, a->s[k].key) == 0;
    if (!same) {
        qsort(b->s, (size_t)b->n, sizeof(CongSample), cong_cmp_key);
        qsort(a->s, (size_t)a->n, sizeof(CongSample), cong_cmp_key);
    }
    CongMoved *moved = malloc(sizeof(CongMoved) * (size_t)(b->n + 1));
    int i = 0, j = 0;
    while (moved && (i < b->n || j < a->n)) {
        int c = i >= b->n ? 1 : j >= a->n ? -1 : strcmp(b->s[i].key, a->s[j].key);
        if (c < 0) {                        /* only before: vanished (or a fault counted once) */
            faults[b->s[i].fault == CONG_OK ? CF_VANISHED : b->s[i].fault == CONG_GARBAGE ? CF_GARBAGE
                                            : CF_UNREADABLE]++;
            i++;
        } else if (c > 0) {                 /* only after: no baseline; its fault still counts */
            if (a->s[j].fault != CONG_OK)
                faults[a->s[j].fault == CONG_GARBAGE ? CF_GARBAGE : CF_UNREADABLE]++;
            j++;
        } else {
            const CongSample *x = &b->s[i], *y = &a->s[j];
            if (y->fault != CONG_OK || x->fault != CONG_OK)
                faults[(y->fault != CONG_OK ? y->fault : x->fault) == CONG_GARBAGE ? CF_GARBAGE : CF_UNREADABLE]++;
            else {
                read++;
                if (y->value < x->value)
                    faults[CF_BACKWARDS]++;
                else if (y->value > x->value) {
                    moved[nmoved].key = y->key;
                    moved[nmoved++].d = y->value - x->value;
                }
            }
            i++;
            j++;
        }
    }
    if (moved)
        qsort(moved, (size_t)nmoved, sizeof(CongMoved), cong_cmp_moved);
    int keep = nmoved < CONG_MAX_MOVED ? nmoved : CONG_MAX_MOVED;
    size_t cap = 512 + (size_t)CONG_HOST_LEN * 6 + (size_t)keep * (CONG_MAX_KEY * 6 + 32);
    char *out = malloc(cap), quoted[CONG_HOST_LEN * 6 + 3], qk[CONG_MAX_KEY * 6 + 3];
    size_t n = 0;
    if (!out) {
        free(moved);
        *len = 0;
        return NULL;
    }
    json_string(quoted, sizeof(quoted), cong.host);
    n += (size_t)snprintf(out + n, cap - n, "%s:{\"dt\":%.6f,\"n\":%d,\"src\":%d,\"f\":[%d,%d,%d,%d],\"drop\":%d,\"us\":%.1f,\"r\":%d,\"d\":{",
                          quoted, a->mono - b->mono, read, b->sources < a->sources ? b->sources : a->sources,
                          faults[CF_VANISHED], faults[CF_UNREADABLE], faults[CF_BACKWARDS], faults[CF_GARBAGE],
                          nmoved - keep, cong.snap_us, cong.rank);
    for (int k = 0; k < keep; k++) {
        json_string(qk, sizeof(qk), moved[k].key);
        n += (size_t)snprintf(out + n, cap - n, "%s%s:%llu", k ? "," : "", qk, moved[k].d);
    }
    n += (size_t)snprintf(out + n, cap - n, "}}");
    free(moved);
    *len = (int)n;
    return out;
}

/* After the step: readers snapshot, their fragments go to rank 0, which prints the CBCONG line. */
static void cong_after_step(int rank, int loop, int index)
{
    if (!cong.enabled || !cong.reader)
        return;
    double started = cong_mono();
    cong_snapshot(&cong.after);
    cong.snap_us = (cong_mono() - started) * 1e6;
    cong.have_after = 1;
    int len = 0, nreaders = 0, leader_rank = 0;
    char *frag = cong_fragment(&len);
    MPI_Comm_size(cong.leaders, &nreaders);
    MPI_Comm_rank(cong.leaders, &leader_rank);
    int *lens = leader_rank == 0 ? calloc((size_t)nreaders, sizeof(int)) : NULL;
    int *displs = leader_rank == 0 ? calloc((size_t)nreaders, sizeof(int)) : NULL;
    MPI_Gather(&len, 1, MPI_INT, lens, 1, MPI_INT, 0, cong.leaders);
    char *all = NULL;
    long long total = 0;
    if (leader_rank == 0 && lens && displs) {
        for (int r = 0; r < nreaders; r++) {
            displs[r] = (int)total;
            total += lens[r];
        }
        all = total < INT_MAX ? malloc((size_t)total + 1) : NULL;
    }
    MPI_Gatherv(frag ? frag : "", len, MPI_CHAR, all, lens, displs, MPI_CHAR, 0, cong.leaders);
    if (leader_rank == 0 && all) {
        size_t cap = (size_t)total + (size_t)nreaders + 256, n = 0;
        char *line = malloc(cap);
        if (line) {
            n += (size_t)snprintf(line, cap, "CBCONG {\"loop\":%d,\"step\":%d,\"t0\":%.6f,\"t1\":%.6f,\"hosts\":{",
                                  loop, index, cong.before.wall, cong.after.wall);
            int first = 1;
            for (int r = 0; r < nreaders; r++) {
                if (!lens[r])
                    continue;
                if (!first)
                    line[n++] = ',';
                memcpy(line + n, all + displs[r], (size_t)lens[r]);
                n += (size_t)lens[r];
                first = 0;
            }
            n += (size_t)snprintf(line + n, cap - n, "}}\n");
            fwrite(line, 1, n, stdout);     /* one write: a reader never sees half a line */
            fflush(stdout);
            free(line);
        }
    }
    (void)rank;
    free(all);
    free(lens);
    free(displs);
    free(frag);
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
static void json_string(char *out, size_t outlen, const char *s)
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
