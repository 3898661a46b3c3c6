/*
 * engine_paths.c: per-peer evidence, which path and not only which host (collbench_engine.h).
 *
 * Around each step, where engine_counters.c reads the host counters (the lowest rank of each
 * host, outside the timed loop), the same reader reads
 *   tcp   the kernel's tcp_info of its TCP sockets to the job's other hosts, by netlink
 *         inet_diag (NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY: what `ss -ti` reads), IPv4 and IPv6:
 *         a dump the kernel filters to those peers (build_filter), then, for 10 s, each of the
 *         dumped sockets asked for by id (tcp_lookup), a socket made in between found by the
 *         next dump and counted whole in the step that finds it;
 *   qp    per-QP counters and each QP's peer from a fixture tree shaped like netlink RDMA's
 *         objects (`rdma res show qp` + `rdma res show cm_id` + `rdma statistic qp`; no RDMA
 *         device exists where this was written, docs/CONGESTION.md "Per-peer evidence"):
 *           <qp_root>/<dev>/<port>/<lqpn>/rqpn              RDMA_NLDEV_ATTR_RES_RQPN
 *           <qp_root>/<dev>/<port>/<lqpn>/dst_addr          RDMA_NLDEV_ATTR_RES_DST_ADDR (its cm_id)
 *           <qp_root>/<dev>/<port>/<lqpn>/counters/<name>   RDMA_NLDEV_ATTR_STAT_HWCOUNTERS of the
 *                                                           counter bound to the QP
 * Deltas are per socket (inet_diag's cookie) or per QP, then summed per peer: a socket or QP
 * that only the after-snapshot holds was made during the step and counts whole; one that
 * closed during the step is left out (its last counts are gone with it). Gauges are read at the
 * step's end: tcp_lost (packets the sockets hold as lost, summed) and tcp_rtt_us_max (the
 * largest smoothed RTT). A peer is named by the host that owns its address (each reader's
 * addresses are gathered at set-up), else by the address; loopback and this host's own
 * addresses are not paths. Only active peers are kept (a socket sent segments or retransmitted,
 * a QP counter moved), at most PATH_MAX_PEERS, the most retransmitting first; the rest count in
 * "pd". Fragment: ,"p":{"PEER|counter":value,...},"ps":sockets+QPs read,"pd":dropped,
 * "pf":failed reads,"pus":µs of the last read.
 */
#define _DEFAULT_SOURCE     /* getifaddrs */

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/tcp.h>

#include "collbench_engine.h"

#define PATH_MAX_SOCKS 8192          /* sockets + QP counters kept per snapshot */
#define PATH_MAX_PEERS 64            /* peers in one host's fragment */
#define PATH_MAX_QP_CTRS 31          /* counters per QP */
#define PATH_MAX_ADDRS 16            /* addresses gathered per host */
#define PATH_ADDR 48                 /* INET6_ADDRSTRLEN and a NUL */
#define PATH_NAME 64
#define PATH_HOST (MPI_MAX_PROCESSOR_NAME + 1)
#define PATH_RECV_BUF (64 * 1024)
#define PATH_MAX_FILE 64
#define PATH_PEER_SLOTS 256          /* peers summed per step (more: counted in "pd") */
#define PATH_MAX_FRAGMENT 65536      /* one host's "p" (more: counted in "pd") */

/* tcp_info fields, in fragment order; the record's counter names (collbench/congestion/counters.py
 * PATH_COUNTERS describes each) */
enum { T_RETRANS, T_LOST, T_CE, T_REORD, T_SEGS_OUT, T_BYTES_RETRANS, T_DSACK, T_OOO, T_RTT, T_N };
static const char *const TCP_NAMES[T_N] = {
    "tcp_retrans_segs", "tcp_lost", "tcp_delivered_ce", "tcp_reord_seen", "tcp_segs_out",
    "tcp_bytes_retrans", "tcp_dsack_dups", "tcp_rcv_ooopack", "tcp_rtt_us_max"};
static const struct { size_t off, size; } TCP_FIELDS[T_N] = {
    {offsetof(struct tcp_info, tcpi_total_retrans), 4}, {offsetof(struct tcp_info, tcpi_lost), 4},
    {offsetof(struct tcp_info, tcpi_delivered_ce), 4}, {offsetof(struct tcp_info, tcpi_reord_seen), 4},
    {offsetof(struct tcp_info, tcpi_segs_out), 4}, {offsetof(struct tcp_info, tcpi_bytes_retrans), 8},
    {offsetof(struct tcp_info, tcpi_dsack_dups), 4}, {offsetof(struct tcp_info, tcpi_rcv_ooopack), 4},
    {offsetof(struct tcp_info, tcpi_rtt), 4}};
#define T_GAUGES ((1u << T_LOST) | (1u << T_RTT))   /* read at the step's end, not differenced */

typedef struct {
    char id[96];                     /* "c<cookie>" of a socket, "<dev>/<port>/<lqpn>/<counter>" of a QP's */
    char peer[PATH_ADDR];
    unsigned long long v[T_N];       /* a QP counter's value is v[0] */
    unsigned have;                   /* bit per field the kernel's tcp_info was long enough for */
    int qp;
    unsigned char family;            /* a socket's: its family and inet_diag id, to ask for it again */
    struct inet_diag_sockid sid;
} PathSample;

typedef struct {
    PathSample *s;
    int n, failed;
} PathSnap;

typedef struct {
    char peer[PATH_HOST];            /* the owning host's name, else the address */
    unsigned long long tcp[T_N];
    unsigned have;
    int active;
    int nqp;
    char qp_name[PATH_MAX_QP_CTRS][PATH_NAME];
    unsigned long long qp_d[PATH_MAX_QP_CTRS];
} PathPeer;

static struct {
    int tcp, enabled;
    char qp_root[1024];
    char (*addr)[PATH_ADDR];         /* every reader's addresses ... */
    char (*owner)[PATH_HOST];        /* ... and the host that owns each */
    int naddr;
    char mine[PATH_MAX_ADDRS][PATH_ADDR];
    int nmine;
    PathSnap before, after;
    double us;
    unsigned char *bc;               /* inet_diag bytecode: "dst is one of the job's hosts" */
    int bclen;
    int nl;                          /* the NETLINK_SOCK_DIAG socket, kept open (-1: none yet) */
    struct { unsigned char family; struct inet_diag_sockid sid; } *known;   /* the last dump's sockets */
    int nknown, stale;
    int naive;                       /* bench hook: a dump of every socket at every snapshot */
    double dumped_at;
    PathPeer *peers;                 /* PATH_PEER_SLOTS, and the receive buffer: allocated once, */
    char *buf;                       /* never freed per step (a freed large block would move
                                      * glibc's mmap threshold under MPI's own buffers) */
} paths;

static double paths_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- set-up: this host's addresses, every reader's, gathered over the readers' communicator */

static void own_addresses(void)
{
    struct ifaddrs *ifs = NULL;
    paths.nmine = 0;
    if (getifaddrs(&ifs) != 0)
        return;
    for (struct ifaddrs *i = ifs; i && paths.nmine < PATH_MAX_ADDRS; i = i->ifa_next) {
        if (!i->ifa_addr || (i->ifa_flags & IFF_LOOPBACK))
            continue;
        const void *a = i->ifa_addr->sa_family == AF_INET ? (const void *)&((struct sockaddr_in *)i->ifa_addr)->sin_addr
                      : i->ifa_addr->sa_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr
                      : NULL;
        if (a && inet_ntop(i->ifa_addr->sa_family, a, paths.mine[paths.nmine], PATH_ADDR))
            paths.nmine++;
    }
    freeifaddrs(ifs);
}

static void build_filter(void);

int paths_setup(int tcp, const char *qp_root, MPI_Comm leaders, const char *host)
{
    int nreaders = 0;
    paths.tcp = tcp;
    paths.nl = -1;
    snprintf(paths.qp_root, sizeof(paths.qp_root), "%s", qp_root ? qp_root : "");
    paths.enabled = tcp || paths.qp_root[0];
    own_addresses();                /* every reader gathers, whether its own host reads paths or not */
    MPI_Comm_size(leaders, &nreaders);
    char (*mine)[PATH_ADDR] = calloc(PATH_MAX_ADDRS, PATH_ADDR), hostname[PATH_HOST];
    paths.addr = calloc((size_t)nreaders * PATH_MAX_ADDRS, PATH_ADDR);
    paths.owner = calloc((size_t)nreaders, PATH_HOST);
    if (!mine || !paths.addr || !paths.owner)
        MPI_Abort(MPI_COMM_WORLD, EXIT_NO_MEMORY);
    memcpy(mine, paths.mine, sizeof(paths.mine));
    memset(hostname, 0, sizeof(hostname));
    snprintf(hostname, sizeof(hostname), "%s", host);
    MPI_Allgather(mine, PATH_MAX_ADDRS * PATH_ADDR, MPI_CHAR, paths.addr, PATH_MAX_ADDRS * PATH_ADDR, MPI_CHAR, leaders);
    MPI_Allgather(hostname, PATH_HOST, MPI_CHAR, paths.owner, PATH_HOST, MPI_CHAR, leaders);
    paths.naddr = nreaders * PATH_MAX_ADDRS;
    free(mine);
    if (!paths.enabled)
        return 0;
    paths.before.s = malloc(sizeof(PathSample) * PATH_MAX_SOCKS);
    paths.after.s = malloc(sizeof(PathSample) * PATH_MAX_SOCKS);
    paths.known = malloc(sizeof(*paths.known) * PATH_MAX_SOCKS);
    paths.peers = calloc(PATH_PEER_SLOTS, sizeof(PathPeer));
    paths.buf = malloc(PATH_RECV_BUF);
    if (!paths.before.s || !paths.after.s || !paths.known || !paths.peers || !paths.buf)
        MPI_Abort(MPI_COMM_WORLD, EXIT_NO_MEMORY);
    /* bench hook (bench/congestion_overhead.py): COLLBENCH_ENGINE_PATHS_NAIVE=1 dumps every socket
     * at every snapshot, no filter and no lookups: the cost this reader avoids */
    const char *naive = getenv("COLLBENCH_ENGINE_PATHS_NAIVE");
    paths.naive = naive && strcmp(naive, "1") == 0;
    if (tcp && !paths.naive)
        build_filter();             /* a job on one host: no tcp path, then no "p" at all */
    paths.enabled = paths.tcp || paths.qp_root[0];
    return 0;
}

/* The name a peer address goes by: the reader's host owning it, else the address itself;
 * NULL for loopback and this host's own addresses (not a path). */
static const char *peer_name(const char *addr)
{
    if (strncmp(addr, "127.", 4) == 0 || strcmp(addr, "::1") == 0 || !addr[0])
        return NULL;
    for (int i = 0; i < paths.nmine; i++)
        if (strcmp(paths.mine[i], addr) == 0)
            return NULL;
    for (int i = 0; i < paths.naddr; i++)
        if (paths.addr[i][0] && strcmp(paths.addr[i], addr) == 0)
            return paths.owner[i / PATH_MAX_ADDRS];
    return addr;
}

/* The kernel's filter for the dump: a socket whose peer is one of the other readers' addresses.
 * The kernel still walks every socket but fills tcp_info only for these (a node's other sockets,
 * ssh, storage, monitoring, are not the job's paths and cost ~1 µs each otherwise). The chain
 * is what `ss` compiles "dst A or dst B or ...": each condition jumps to a JMP to the end (yes)
 * or over it to the next condition (no); the last one's no lands past the end (rejected).
 * Left unset (every socket dumped) when the job's addresses would not fit one netlink attribute. */
#define PATH_MAX_BC 60000

static void build_filter(void)
{
    unsigned char *bc = malloc(PATH_MAX_BC);
    int n = 0, nconds = 0, starts[4096];
    if (!bc)
        return;
    for (int i = 0; i < paths.naddr && nconds < 4096; i++) {
        unsigned char a[16];
        int fam = inet_pton(AF_INET, paths.addr[i], a) == 1 ? AF_INET
                : inet_pton(AF_INET6, paths.addr[i], a) == 1 ? AF_INET6 : 0;
        int alen = fam == AF_INET ? 4 : 16, size = (int)(sizeof(struct inet_diag_bc_op) + sizeof(struct inet_diag_hostcond)) + alen;
        if (!fam || !peer_name(paths.addr[i]))
            continue;                               /* empty slot, or this host's own */
        if (n + size + (int)sizeof(struct inet_diag_bc_op) > PATH_MAX_BC) {
            free(bc);
            return;
        }
        struct inet_diag_bc_op op = {INET_DIAG_BC_D_COND, (unsigned short)size, (unsigned short)(size + 4)};
        struct inet_diag_hostcond hc = {(unsigned char)fam, (unsigned char)(alen * 8), -1};
        starts[nconds++] = n;
        memcpy(bc + n, &op, sizeof(op));
        memcpy(bc + n + sizeof(op), &hc, sizeof(hc));
        memcpy(bc + n + sizeof(op) + sizeof(hc), a, (size_t)alen);
        n += size;
        struct inet_diag_bc_op jmp = {INET_DIAG_BC_JMP, 4, 0};   /* its no: set below, to the end */
        memcpy(bc + n, &jmp, sizeof(jmp));
        n += (int)sizeof(jmp);
    }
    if (!nconds) {                                  /* a job on one host: no path to read */
        free(bc);
        paths.tcp = 0;
        return;
    }
    n -= (int)sizeof(struct inet_diag_bc_op);       /* the last condition needs no JMP after it */
    for (int c = 0; c < nconds - 1; c++) {
        int size = ((struct inet_diag_bc_op *)(bc + starts[c]))->yes, at = starts[c] + size;
        unsigned short to_end = (unsigned short)(n - at);
        memcpy(bc + at + offsetof(struct inet_diag_bc_op, no), &to_end, sizeof(to_end));
    }
    paths.bc = bc;
    paths.bclen = n;
}

/* ---- tcp: one inet_diag dump per address family */

static void tcp_sample(PathSnap *sn, const struct inet_diag_msg *m, int len)
{
    char addr[PATH_ADDR] = "";
    const struct tcp_info *ti = NULL;
    int tlen = 0;
    for (struct rtattr *a = (struct rtattr *)(m + 1); RTA_OK(a, len); a = RTA_NEXT(a, len))
        if (a->rta_type == INET_DIAG_INFO) {
            ti = RTA_DATA(a);
            tlen = (int)RTA_PAYLOAD(a);
        }
    if (!ti || sn->n >= PATH_MAX_SOCKS)
        return;
    if (m->idiag_family == AF_INET)
        inet_ntop(AF_INET, m->id.idiag_dst, addr, sizeof(addr));
    else {
        const unsigned char *b = (const unsigned char *)m->id.idiag_dst;
        static const unsigned char v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(b, v4mapped, 12) == 0)
            inet_ntop(AF_INET, b + 12, addr, sizeof(addr));
        else
            inet_ntop(AF_INET6, b, addr, sizeof(addr));
    }
    if (!peer_name(addr))
        return;
    PathSample *x = &sn->s[sn->n++];
    memset(x, 0, sizeof(*x));
    snprintf(x->id, sizeof(x->id), "c%08x%08x", m->id.idiag_cookie[1], m->id.idiag_cookie[0]);
    snprintf(x->peer, sizeof(x->peer), "%s", addr);
    x->family = m->idiag_family;
    x->sid = m->id;
    for (int f = 0; f < T_N; f++) {
        if (TCP_FIELDS[f].off + TCP_FIELDS[f].size > (size_t)tlen)
            continue;                           /* an older kernel's shorter tcp_info */
        const unsigned char *p = (const unsigned char *)ti + TCP_FIELDS[f].off;
        if (TCP_FIELDS[f].size == 8) {
            uint64_t v;
            memcpy(&v, p, 8);
            x->v[f] = v;
        } else {
            uint32_t v;
            memcpy(&v, p, 4);
            x->v[f] = v;
        }
        x->have |= 1u << f;
    }
}

static int netlink_socket(void)
{
    if (paths.nl >= 0)
        return paths.nl;
    paths.nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (paths.nl >= 0) {
        struct timeval tv = {1, 0};             /* a kernel that never answers costs 1 s, once */
        setsockopt(paths.nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    }
    return paths.nl;
}

static void netlink_reset(void)
{
    if (paths.nl >= 0)
        close(paths.nl);
    paths.nl = -1;
}

static void fill_request(struct nlmsghdr *nh, struct inet_diag_req_v2 *r, int family, int flags, unsigned seq)
{
    memset(nh, 0, sizeof(*nh));
    memset(r, 0, sizeof(*r));
    nh->nlmsg_type = SOCK_DIAG_BY_FAMILY;
    nh->nlmsg_flags = (unsigned short)(NLM_F_REQUEST | flags);
    nh->nlmsg_seq = seq;
    r->sdiag_family = (unsigned char)family;
    r->sdiag_protocol = IPPROTO_TCP;
    r->idiag_ext = 1u << (INET_DIAG_INFO - 1);
    /* connections only: not LISTEN (10), TIME_WAIT (6), CLOSE (7), SYN_RECV (3) */
    r->idiag_states = ~((1u << 10) | (1u << 6) | (1u << 7) | (1u << 3)) & 0xfff;
}

/* Read replies until `expect` answers came (a lookup batch) or NLMSG_DONE (a dump: expect < 0);
 * a lookup answered with an error (the socket closed) marks the list stale. 0, or -1. */
static int receive(PathSnap *sn, char *buf, int expect)
{
    int answers = 0;
    for (int rounds = 0; rounds < 100000; rounds++) {
        ssize_t got = recv(paths.nl, buf, PATH_RECV_BUF, 0);
        if (got <= 0)
            return -1;
        int len = (int)got;
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
            if (h->nlmsg_type == NLMSG_DONE)
                return expect < 0 ? 0 : -1;
            if (h->nlmsg_type == NLMSG_ERROR) {
                const struct nlmsgerr *e = NLMSG_DATA(h);
                if (expect < 0 || h->nlmsg_len < NLMSG_LENGTH(sizeof(*e)))
                    return -1;
                paths.stale |= e->error != 0;
            } else if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY
                       && h->nlmsg_len >= NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
                tcp_sample(sn, NLMSG_DATA(h), (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(struct inet_diag_msg))));
            else
                continue;
            if (expect >= 0 && ++answers >= expect)
                return 0;
        }
    }
    return -1;
}

/* Every socket of one family whose peer passes the kernel's filter (paths.bc). */
static int tcp_dump(PathSnap *sn, int family, char *buf)
{
    struct {
        struct nlmsghdr nh;
        struct inet_diag_req_v2 r;
        struct rtattr bc;                       /* INET_DIAG_REQ_BYTECODE, then paths.bc */
    } req;
    fill_request(&req.nh, &req.r, family, NLM_F_DUMP, 0);
    size_t reqlen = NLMSG_LENGTH(sizeof(struct inet_diag_req_v2));
    struct iovec iov[2] = {{&req, reqlen}, {paths.bc, 0}};
    memset(&req.bc, 0, sizeof(req.bc));
    if (paths.bc) {
        req.bc.rta_type = INET_DIAG_REQ_BYTECODE;
        req.bc.rta_len = (unsigned short)RTA_LENGTH(paths.bclen);
        iov[0].iov_len = reqlen + sizeof(struct rtattr);
        iov[1].iov_len = (size_t)paths.bclen;
    }
    req.nh.nlmsg_len = (unsigned)(iov[0].iov_len + iov[1].iov_len);
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    struct msghdr msg = {.msg_name = &kernel, .msg_namelen = sizeof(kernel), .msg_iov = iov, .msg_iovlen = paths.bc ? 2 : 1};
    if (netlink_socket() < 0 || sendmsg(paths.nl, &msg, 0) < 0)
        return -1;
    return receive(sn, buf, -1);
}

/* The last dump's sockets asked for one by one (exact id and cookie), batched in one message:
 * a dump walks the kernel's whole TCP hash table (measured ~350 µs on a 24 GB machine with two
 * sockets to read), a lookup is a hash probe. */
#define PATH_BATCH 128
static int tcp_lookup(PathSnap *sn, char *buf)
{
    static struct { struct nlmsghdr nh; struct inet_diag_req_v2 r; } req[PATH_BATCH];
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    for (int at = 0; at < paths.nknown; at += PATH_BATCH) {
        int n = paths.nknown - at < PATH_BATCH ? paths.nknown - at : PATH_BATCH;
        for (int i = 0; i < n; i++) {
            fill_request(&req[i].nh, &req[i].r, paths.known[at + i].family, 0, (unsigned)(at + i + 1));
            req[i].nh.nlmsg_len = NLMSG_LENGTH(sizeof(struct inet_diag_req_v2));
            req[i].r.id = paths.known[at + i].sid;
        }
        if (netlink_socket() < 0
            || sendto(paths.nl, req, sizeof(req[0]) * (size_t)n, 0, (struct sockaddr *)&kernel, sizeof(kernel)) < 0
            || receive(sn, buf, n) < 0)
            return -1;
    }
    return 0;
}

#define PATH_REDUMP_SECONDS 10.0   /* sockets made since the last dump are found within this */

static void tcp_read(PathSnap *sn)
{
    char *buf = paths.buf;
    double now = paths_mono();
    int lookup = !paths.naive && paths.nknown > 0 && !paths.stale && now - paths.dumped_at < PATH_REDUMP_SECONDS;
    int first = sn->n;
    if (lookup && tcp_lookup(sn, buf) < 0) {
        sn->n = first;                          /* start again with a dump */
        netlink_reset();
        lookup = 0;
    }
    if (!lookup) {
        if (tcp_dump(sn, AF_INET, buf) < 0 || tcp_dump(sn, AF_INET6, buf) < 0) {
            sn->failed++;
            netlink_reset();
        } else {
            paths.nknown = 0;
            for (int i = first; i < sn->n; i++) {
                paths.known[paths.nknown].family = sn->s[i].family;
                paths.known[paths.nknown++].sid = sn->s[i].sid;
            }
            paths.dumped_at = now;
            paths.stale = 0;
        }
    }
}

/* ---- qp: the fixture tree (netlink RDMA's objects, one value per file) */

static int read_small(const char *path, char *out, size_t outlen)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(out, 1, outlen - 1, f);
    int bad = ferror(f) || (n == outlen - 1 && fgetc(f) != EOF);
    fclose(f);
    if (bad)
        return -1;
    out[n] = '\0';
    out[strcspn(out, " \t\r\n")] = '\0';    /* one token */
    return 0;
}

static int parse_count(const char *s, unsigned long long *out)
{
    unsigned long long v = 0;
    if (!*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (ULLONG_MAX - (unsigned)(*s - '0')) / 10)
            return -1;
        v = v * 10 + (unsigned)(*s - '0');
    }
    *out = v;
    return 0;
}

static int plain(const char *name)
{
    return name[0] != '.' && strlen(name) < 40 && !strchr(name, '|') && !strchr(name, '"');
}

/* one QP: its peer, then each counter bound to it */
static void qp_read(PathSnap *sn, const char *dir, const char *id)
{
    char path[1300], peer[PATH_MAX_FILE], value[PATH_MAX_FILE];
    snprintf(path, sizeof(path), "%.1199s/dst_addr", dir);
    if (read_small(path, peer, sizeof(peer)) < 0 || !peer[0]) {
        sn->failed++;                           /* a QP without a known peer: no path */
        return;
    }
    char *port = strrchr(peer, ':');            /* cm_id's "10.0.0.2:4791" or "[fe80::1]:4791" */
    if (peer[0] == '[') {
        memmove(peer, peer + 1, strlen(peer));
        if ((port = strchr(peer, ']')))
            *port = '\0';
    } else if (port && strchr(peer, ':') == port)
        *port = '\0';
    struct in6_addr probe;
    if ((inet_pton(AF_INET, peer, &probe) != 1 && inet_pton(AF_INET6, peer, &probe) != 1) || !peer_name(peer)) {
        sn->failed += peer_name(peer) != NULL;
        return;
    }
    snprintf(path, sizeof(path), "%.1199s/counters", dir);
    DIR *d = opendir(path);
    if (!d) {
        sn->failed++;
        return;
    }
    int kept = 0;
    for (struct dirent *e = readdir(d); e && kept < PATH_MAX_QP_CTRS; e = readdir(d)) {
        if (!plain(e->d_name) || sn->n >= PATH_MAX_SOCKS)
            continue;
        snprintf(path, sizeof(path), "%.1199s/counters/%.39s", dir, e->d_name);
        unsigned long long v;
        if (read_small(path, value, sizeof(value)) < 0 || parse_count(value, &v) < 0) {
            sn->failed++;
            continue;
        }
        PathSample *x = &sn->s[sn->n++];
        memset(x, 0, sizeof(*x));
        snprintf(x->id, sizeof(x->id), "%.40s/%.40s", id, e->d_name);
        snprintf(x->peer, sizeof(x->peer), "%s", peer);
        x->v[0] = v;
        x->qp = 1;
        kept++;
    }
    closedir(d);
}

static void qp_dump(PathSnap *sn)
{
    char path[1200], id[PATH_NAME];     /* names are plain(): under 40 bytes */
    DIR *devs = opendir(paths.qp_root);
    if (!devs) {
        sn->failed++;
        return;
    }
    for (struct dirent *dev = readdir(devs); dev; dev = readdir(devs)) {
        if (!plain(dev->d_name))
            continue;
        snprintf(path, sizeof(path), "%.1023s/%.39s", paths.qp_root, dev->d_name);
        DIR *ports = opendir(path);
        for (struct dirent *port = ports ? readdir(ports) : NULL; port; port = readdir(ports)) {
            if (!plain(port->d_name))
                continue;
            snprintf(path, sizeof(path), "%.1023s/%.39s/%.39s", paths.qp_root, dev->d_name, port->d_name);
            DIR *qps = opendir(path);
            for (struct dirent *qp = qps ? readdir(qps) : NULL; qp; qp = readdir(qps)) {
                if (!plain(qp->d_name))
                    continue;
                snprintf(path, sizeof(path), "%.1023s/%.39s/%.39s/%.39s", paths.qp_root, dev->d_name, port->d_name, qp->d_name);
                snprintf(id, sizeof(id), "%.16s/%.4s/%.12s", dev->d_name, port->d_name, qp->d_name);
                qp_read(sn, path, id);
            }
            if (qps)
                closedir(qps);
        }
        if (ports)
            closedir(ports);
    }
    closedir(devs);
}

static int cmp_id(const void *a, const void *b)
{
    return strcmp(((const PathSample *)a)->id, ((const PathSample *)b)->id);
}

static void snapshot(PathSnap *sn)
{
    double t0 = paths_mono();
    sn->n = 0;
    sn->failed = 0;
    if (paths.tcp)
        tcp_read(sn);
    if (paths.qp_root[0])
        qp_dump(sn);
    qsort(sn->s, (size_t)sn->n, sizeof(PathSample), cmp_id);
    paths.us = (paths_mono() - t0) * 1e6;
}

void paths_before(int reuse_after)
{
    if (!paths.enabled)
        return;
    if (reuse_after) {
        PathSnap t = paths.before;
        paths.before = paths.after;
        paths.after = t;
    } else
        snapshot(&paths.before);
}

void paths_after(void)
{
    if (paths.enabled)
        snapshot(&paths.after);
}

/* ---- the fragment: per-sample deltas summed per peer */

static PathPeer *peer_slot(PathPeer *peers, int *npeers, int cap, const char *addr)
{
    const char *name = peer_name(addr);
    for (int i = 0; i < *npeers; i++)
        if (strcmp(peers[i].peer, name) == 0)
            return &peers[i];
    if (*npeers >= cap)
        return NULL;
    PathPeer *p = &peers[(*npeers)++];
    memset(p, 0, sizeof(*p));
    snprintf(p->peer, sizeof(p->peer), "%s", name);
    return p;
}

static void add_sample(PathPeer *p, const PathSample *y, const PathSample *x)
{
    if (y->qp) {
        unsigned long long d = x ? (y->v[0] >= x->v[0] ? y->v[0] - x->v[0] : 0) : y->v[0];
        const char *name = strrchr(y->id, '/') + 1;
        if (!d)
            return;
        p->active = 1;
        for (int k = 0; k < p->nqp; k++)
            if (strcmp(p->qp_name[k], name) == 0) {
                p->qp_d[k] += d;
                return;
            }
        if (p->nqp < PATH_MAX_QP_CTRS) {
            snprintf(p->qp_name[p->nqp], PATH_NAME, "%s", name);
            p->qp_d[p->nqp++] = d;
        }
        return;
    }
    for (int f = 0; f < T_N; f++) {
        if (!(y->have & (1u << f)))
            continue;
        p->have |= 1u << f;
        if (f == T_RTT)
            p->tcp[f] = y->v[f] > p->tcp[f] ? y->v[f] : p->tcp[f];
        else if (T_GAUGES & (1u << f))
            p->tcp[f] += y->v[f];
        else if (!x)
            p->tcp[f] += y->v[f];
        else if (TCP_FIELDS[f].size == 4)
            p->tcp[f] += (uint32_t)(y->v[f] - x->v[f]);      /* a 32-bit counter that wrapped */
        else
            p->tcp[f] += y->v[f] >= x->v[f] ? y->v[f] - x->v[f] : 0;
    }
    if ((x ? y->v[T_SEGS_OUT] != x->v[T_SEGS_OUT] || y->v[T_RETRANS] != x->v[T_RETRANS] : y->v[T_SEGS_OUT] != 0))
        p->active = 1;
}

static int cmp_peer(const void *a, const void *b)
{
    const PathPeer *x = a, *y = b;
    if (x->tcp[T_RETRANS] != y->tcp[T_RETRANS])
        return x->tcp[T_RETRANS] < y->tcp[T_RETRANS] ? 1 : -1;
    return strcmp(x->peer, y->peer);
}

/* ,"p":{...},"ps":..,"pd":..,"pf":..,"pus":..  in a buffer of its own (NULL when paths are off);
 * *len its length. At most PATH_MAX_FRAGMENT bytes: what does not fit counts in "pd". */
const char *paths_fragment(int *len)
{
    static char out[PATH_MAX_FRAGMENT + 256];
    *len = 0;
    if (!paths.enabled || !paths.peers)
        return NULL;
    const PathSnap *b = &paths.before, *a = &paths.after;
    int npeers = 0, lost = 0, dropped = 0;
    PathPeer *peers = paths.peers;
    for (int i = 0, j = 0; j < a->n; j++) {    /* both sorted by id: a merge */
        while (i < b->n && strcmp(b->s[i].id, a->s[j].id) < 0)
            i++;
        const PathSample *x = i < b->n && strcmp(b->s[i].id, a->s[j].id) == 0 ? &b->s[i] : NULL;
        PathPeer *p = peer_slot(peers, &npeers, PATH_PEER_SLOTS, a->s[j].peer);
        if (p)
            add_sample(p, &a->s[j], x);
        else
            lost++;
    }
    int active = 0;
    for (int k = 0; k < npeers; k++)
        if (peers[k].active)
            peers[active++] = peers[k];
    qsort(peers, (size_t)active, sizeof(PathPeer), cmp_peer);
    int keep = active < PATH_MAX_PEERS ? active : PATH_MAX_PEERS;
    char qk[PATH_HOST * 6 + PATH_NAME + 8], key[PATH_HOST + PATH_NAME + 8], entry[sizeof(qk) + 32];
    size_t n = (size_t)snprintf(out, sizeof(out), ",\"p\":{");
    int first = 1;
    for (int k = 0; k < keep; k++) {
        const PathPeer *p = &peers[k];
        for (int e = 0; e < T_N + p->nqp; e++) {
            if (e < T_N && !(p->have & (1u << e)))
                continue;
            if (e < T_N)
                snprintf(key, sizeof(key), "%s|%s", p->peer, TCP_NAMES[e]);
            else
                snprintf(key, sizeof(key), "%s|qp_%s", p->peer, p->qp_name[e - T_N]);
            json_string(qk, sizeof(qk), key);
            int l = snprintf(entry, sizeof(entry), "%s%s:%llu", first ? "" : ",", qk,
                             e < T_N ? p->tcp[e] : p->qp_d[e - T_N]);
            if (n + (size_t)l > PATH_MAX_FRAGMENT) {
                dropped++;
                continue;
            }
            memcpy(out + n, entry, (size_t)l);
            n += (size_t)l;
            first = 0;
        }
    }
    n += (size_t)snprintf(out + n, sizeof(out) - n, "},\"ps\":%d,\"pd\":%d,\"pf\":%d,\"pus\":%.1f",
                          a->n, active - keep + lost + dropped, a->failed, paths.us);
    *len = (int)n;
    return out;
}
