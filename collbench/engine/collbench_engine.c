/*
 * collbench-engine: the built-in MPI collective benchmark (one C99 source).
 *
 *   collbench-engine --plan FILE [--loop] [--validate] [--max-loops N]
 *
 * Plan file: one step per line, "op size_bytes iterations warmup datatype", '#' comments.
 * Rank 0 reads it and broadcasts it, so only the launching host needs the file.
 * Rank 0 prints one "CBREC {json}" line per finished step on stdout, flushed as one write.
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
 * 3 the plan's buffers cannot be allocated. MPI faults abort through MPI itself.
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
#define MAX_PLAN_BYTES (1 << 20)
#define MAX_TOKEN 64
#define MAX_ITERATIONS 1000000000000LL /* warm-up + iterations never overflow */

/* ------------------------------------------------------------------ datatypes */

enum { DT_CHAR, DT_INT, DT_FLOAT, DT_DOUBLE, DT_COUNT };

static const struct {
    const char *name;
    size_t size;
} DATATYPES[DT_COUNT] = {
    {"char", 1}, {"int", sizeof(int)}, {"float", sizeof(float)}, {"double", sizeof(double)},
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
        case DT_INT: return MPI_INT;
        case DT_FLOAT: return MPI_FLOAT;
        default: return MPI_DOUBLE;
    }
}

static void put_value(void *buf, int dt, size_t i, long long v)
{
    switch (dt) {
        case DT_CHAR: ((signed char *)buf)[i] = (signed char)v; break;
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
        case DT_INT: want = (int)expected; break;
        case DT_FLOAT: want = (float)expected; break;
        default: want = (double)expected; break;
    }
    return get_value(buf, dt, i) == want;
}

/* Reduction inputs: 1 + (rank % A) + (i % B). Small enough that a sum over the ranks is
 * exact (float below 2^24; signed char below 128 up to 42 ranks), and the expected sum has
 * a closed form, so checking costs O(count) and not O(count x ranks). */
static long long red_a(int dt) { return dt == DT_CHAR ? 2 : 1000; }
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
    long long m = dt == DT_CHAR ? 127 : 8388593; /* exact in float */
    return ((long long)src * 7919 + (long long)dst * 104729 + (long long)(i % 1000003) * 31 + 1) % m;
}

/* ------------------------------------------------------------------ steps and the op table */

typedef struct {
    int op;         /* index in OPS */
    size_t size;    /* bytes per rank (OSU's message size) */
    long long iterations;
    long long warmup;
    int dt;
    int line;
} Step;

typedef struct {
    MPI_Comm comm;
    int rank, nranks;
    const Step *step;
    size_t count;          /* elements per rank (per peer for alltoall) */
    MPI_Datatype type;
    void *sendbuf, *recvbuf;
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
    return MPI_Allreduce(c->sendbuf, c->recvbuf, (int)c->count, c->type, MPI_SUM, c->comm);
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
    return MPI_Reduce(c->sendbuf, c->recvbuf, (int)c->count, c->type, MPI_SUM, root, c->comm);
}
static long check_reduce(Coll *c, int root)
{
    return c->rank == root ? check_sum_all(c, 0, c->count) : 0;
}

/* reduce_scatter: size is the whole send buffer, split in near-equal blocks as OSU does */
static int call_reduce_scatter(Coll *c, int root)
{
    (void)root;
    return MPI_Reduce_scatter(c->sendbuf, c->recvbuf, c->recvcounts, c->type, MPI_SUM, c->comm);
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
    return MPI_Allgather(c->sendbuf, (int)c->count, c->type, c->recvbuf, (int)c->count, c->type,
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
    return MPI_Alltoall(c->sendbuf, (int)c->count, c->type, c->recvbuf, (int)c->count, c->type,
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
    /* name          red size sendN recvN recv before after rooted call                 fill            check */
    {"allreduce",      1,  1,   0,    0,    1,   0,     1,    0,     call_allreduce,      fill_reduction, check_allreduce},
    {"bcast",          0,  1,   0,    0,    0,   0,     1,    1,     call_bcast,          fill_bcast,     check_bcast},
    {"reduce",         1,  1,   0,    0,    1,   1,     0,    1,     call_reduce,         fill_reduction, check_reduce},
    {"allgather",      0,  1,   0,    1,    1,   0,     1,    0,     call_allgather,      fill_allgather, check_allgather},
    {"alltoall",       0,  1,   1,    1,    1,   0,     1,    0,     call_alltoall,       fill_alltoall,  check_alltoall},
    {"reduce_scatter", 1,  1,   0,    0,    1,   0,     1,    0,     call_reduce_scatter, fill_reduction, check_reduce_scatter},
    {"barrier",        0,  0,   0,    0,    0,   0,     0,    0,     call_barrier,        NULL,           NULL},
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

/* Parse the plan text; on error fill msg and return -1. Identical on every rank. */
static int parse_plan(char *text, const char *path, Plan *plan, char *msg, size_t msglen)
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
        char tok[5][MAX_TOKEN];
        int ntok = 0;
        char *tsave = NULL;
        for (char *t = strtok_r(line, " \t\r", &tsave); t; t = strtok_r(NULL, " \t\r", &tsave)) {
            if (ntok < 5)
                snprintf(tok[ntok], MAX_TOKEN, "%s", t);
            ntok++;
        }
        if (ntok == 0)
            continue;
        if (ntok != 5) {
            snprintf(msg, msglen, "plan %s line %d: expected 5 fields "
                     "\"op size_bytes iterations warmup datatype\", got %d", path, lineno, ntok);
            return -1;
        }
        Step s;
        long long v;
        s.line = lineno;
        s.op = find_op(tok[0]);
        if (s.op < 0) {
            snprintf(msg, msglen, "plan %s line %d: unknown op '%s' (expected allreduce, bcast, "
                     "reduce, allgather, alltoall, reduce_scatter or barrier)", path, lineno, tok[0]);
            return -1;
        }
        s.dt = find_datatype(tok[4]);
        if (s.dt < 0) {
            snprintf(msg, msglen, "plan %s line %d: unknown datatype '%s' "
                     "(expected char, int, float or double)", path, lineno, tok[4]);
            return -1;
        }
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
    int max_rank;
    double t_start, t_end;
    const char *validation;
} StepResult;

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
    if (op->call == call_reduce_scatter) {
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

static void run_timed(Coll *c, StepResult *r)
{
    const OpDef *op = &OPS[c->step->op];
    long long total = c->step->warmup + c->step->iterations;
    double timer = 0.0;

    MPI_Barrier(c->comm);
    r->t_start = wall_clock();
    for (long long i = 0; i < total; i++) {
        if (op->sync_before)
            MPI_Barrier(c->comm);
        double t0 = MPI_Wtime();
        op->call(c, 0);
        double t1 = MPI_Wtime();
        if (op->sync_after)
            MPI_Barrier(c->comm);
        if (i >= c->step->warmup)
            timer += t1 - t0;
    }
    r->t_end = wall_clock();

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
    /* rooted ops: a root other than 0 catches root mix-ups */
    int roots[2] = {0, c->nranks - 1}, nroots = op->rooted && c->nranks > 1 ? 2 : 1;
    long errors = 0;
    char first[512] = "";
    c->first_error = first;
    c->first_error_len = sizeof(first);
    for (int k = 0; k < nroots; k++) {
        op->fill(c, roots[k]);
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
    char line[1024];
    int n = snprintf(line, sizeof(line),
                     "CBREC {\"op\":\"%s\",\"size_bytes\":%zu,\"datatype\":\"%s\",\"iterations\":%lld,"
                     "\"warmup\":%lld,\"avg_us\":%.4f,\"min_us\":%.4f,\"max_us\":%.4f,\"max_rank\":%d,"
                     "\"validation\":\"%s\",\"loop\":%d,\"step\":%d,\"t_start\":%.6f,\"t_end\":%.6f,"
                     "\"ranks\":%d}\n",
                     OPS[s->op].name, s->size, DATATYPES[s->dt].name, s->iterations, s->warmup,
                     r->avg_us, r->min_us, r->max_us, r->max_rank, r->validation, loop, index,
                     r->t_start, r->t_end, nranks);
    /* one write per record: a reader never sees half a line */
    fwrite(line, 1, (size_t)n, stdout);
    fflush(stdout);
}

/* ------------------------------------------------------------------ main */

static void usage(FILE *f)
{
    fprintf(f, "usage: collbench-engine --plan FILE [--loop] [--validate] [--max-loops N]\n"
               "  plan lines: op size_bytes iterations warmup datatype   (# comments)\n"
               "  ops: allreduce bcast reduce allgather alltoall reduce_scatter barrier\n"
               "  datatypes: char int float double\n");
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

static int finish(int code)
{
    MPI_Finalize();
    return code;
}

int main(int argc, char **argv)
{
    int rank, nranks, loop_mode = 0, validate = 0;
    long long max_loops = 0;
    const char *plan_path = NULL;
    char msg[1024] = "";

    const char *corrupt = getenv("COLLBENCH_ENGINE_CORRUPT_RANK");
    if (corrupt && *corrupt)
        corrupt_rank = atoi(corrupt);
    install_signal_handlers();
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    char_sum_ok = probe_char_sum();

    for (int i = 1; i < argc && !msg[0]; i++) {
        if (strcmp(argv[i], "--plan") == 0 && i + 1 < argc)
            plan_path = argv[++i];
        else if (strcmp(argv[i], "--loop") == 0)
            loop_mode = 1;
        else if (strcmp(argv[i], "--validate") == 0)
            validate = 1;
        else if (strcmp(argv[i], "--max-loops") == 0 && i + 1 < argc) {
            if (parse_long(argv[i + 1], 1, INT_MAX, &max_loops) < 0)
                snprintf(msg, sizeof(msg), "--max-loops: '%s' is not a whole number >= 1", argv[i + 1]);
            loop_mode = 1;
            i++;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            if (rank == 0)
                usage(stdout);
            return finish(0);
        } else
            snprintf(msg, sizeof(msg), "unknown or incomplete argument '%s'", argv[i]);
    }
    if (!msg[0] && !plan_path)
        snprintf(msg, sizeof(msg), "--plan FILE is required");
    if (msg[0]) {
        if (rank == 0) {
            fprintf(stderr, "collbench-engine: %s\n", msg);
            usage(stderr);
        }
        return finish(EXIT_BAD_INPUT);
    }

    Plan plan = {NULL, 0};
    char *text = read_plan_everywhere(plan_path, rank, msg, sizeof(msg));
    if (!text || parse_plan(text, plan_path, &plan, msg, sizeof(msg)) < 0) {
        if (rank == 0)
            fprintf(stderr, "collbench-engine: %s\n", msg);
        return finish(EXIT_BAD_INPUT);
    }
    free(text);

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
            run_timed(&c, &r);
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
