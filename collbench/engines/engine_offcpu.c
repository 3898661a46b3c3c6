/*
 * The off-CPU reader: the share of a step's timed loop each rank's thread spent off its CPU
 * (descheduled: a CPU hog, a cgroup quota, throttling), reduced to rank 0 after the timed
 * figures. MPI ranks poll while they wait, so a healthy rank stays on its CPU; the rank with the
 * largest time per call (max_rank) is usually one that waited for the late one, and the smallest
 * (a MINLOC) is too often the op's structure to name it (docs/DIAGNOSIS.md).
 */
#define _POSIX_C_SOURCE 200809L

#include <time.h>

#include "collbench_engine.h"

/* This thread's CPU time in seconds, or -1 when the clock is unavailable. */
double offcpu_clock(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return -1.0;
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Collective over comm: the rank off its CPU the largest share of `wall` (MAXLOC), that share
 * (0..1), and the mean share over ranks; the results are set on rank 0. */
void offcpu_reduce(double cpu0, double cpu1, double wall, int rank, int nranks, MPI_Comm comm,
                   int *worst_rank, double *worst, double *mean)
{
    double offsum = 0.0;
    double off = cpu0 < 0 || cpu1 < 0 || wall <= 0 ? 0.0 : 1.0 - (cpu1 - cpu0) / wall;
    struct { double value; int rank; } offmine = {off < 0 ? 0.0 : off, rank}, offworst = {0.0, 0};
    MPI_Reduce(&offmine, &offworst, 1, MPI_DOUBLE_INT, MPI_MAXLOC, 0, comm);
    MPI_Reduce(&offmine.value, &offsum, 1, MPI_DOUBLE, MPI_SUM, 0, comm);
    *worst_rank = offworst.rank;
    *worst = offworst.value;
    *mean = offsum / nranks;
}
