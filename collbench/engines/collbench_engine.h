/*
 * collbench-engine's sources share this header (build.py compiles them into one binary):
 *
 *   collbench_engine.c   ops, plan, timing, validation, hosts and pairs, main
 *   engine_counters.c    --congestion: the host counters around each step (sysfs, SIOCETHTOOL,
 *                        netstat) and the CBCONG line
 *   engine_paths.c       per-peer evidence in that line: tcp_info per socket (netlink inet_diag)
 *                        and per-QP RDMA counters (a fixture tree), summed per peer
 *   engine_offcpu.c      the share of a timed loop each rank's thread spent off its CPU
 */
#ifndef COLLBENCH_ENGINE_H
#define COLLBENCH_ENGINE_H

#include <mpi.h>
#include <stddef.h>
#include <stdio.h>

#define EXIT_VALIDATION 1
#define EXIT_BAD_INPUT 2
#define EXIT_NO_MEMORY 3
#define EXIT_MPI_ERROR 4

/* collbench_engine.c */
double wall_clock(void);
char *read_bounded(FILE *f, size_t limit, size_t *len);
void json_string(char *out, size_t outlen, const char *s);

/* engine_counters.c: every rank calls these (a no-op without --congestion or off the host's
 * reader rank); the reads happen outside the timed loop */
int cong_setup(const char *spec_path, int rank, int nranks);
void cong_before_step(int fresh);
void cong_after_step(int rank, int loop, int index);

/* engine_paths.c: called by engine_counters.c on each host's reader; paths_setup is collective
 * over the readers' communicator */
int paths_setup(int tcp, const char *qp_root, MPI_Comm leaders, const char *host);
void paths_before(int reuse_after);
void paths_after(void);
const char *paths_fragment(int *len);

/* engine_offcpu.c: the thread's CPU clock around the loop, then the share reduced to rank 0 */
double offcpu_clock(void);
void offcpu_reduce(double cpu0, double cpu1, double wall, int rank, int nranks, MPI_Comm comm,
                   int *worst_rank, double *worst, double *mean);

#endif
