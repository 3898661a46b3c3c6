/*
 * engine_counters.c: the engine's congestion counters (collbench_engine.h).
 *
 * --congestion SPEC: the lowest rank of each host reads that host's congestion counters
 * immediately before and after each step's timed loop (outside the timed region), and rank 0
 * prints, before the step's CBREC line, one line
 *   CBCONG {"loop":L,"step":S,"t0":wall,"t1":wall,"hosts":{"HOST":{"dt":s,"n":read,"src":sources,
 *           "f":[vanished,unreadable,backwards,garbage],"drop":k,"us":snapshot µs,"r":reader's rank,
 *           "d":{"counter@where":delta,...}[,"p":{"PEER|counter":delta,...},"ps":..,"pd":..,"pf":..,"pus":..]},...}}
 * with only the counters that moved (at most CONG_MAX_MOVED per host, the largest; the rest in
 * "drop"). Which counters, and where each host reads them, is the SPEC file Python writes from
 * its one table (collbench/congestion/sources.py spec_text): this code knows no counter names.
 * Without --validate a step's after-snapshot is the next step's before (cong_before_step).
 * Faults follow collbench/congestion/deltas.py: a counter that vanished, cannot be read, went
 * backwards or holds garbage is skipped and counted, never a negative delta, never a failed step.
 * With the spec's "paths tcp" line or a host's rdma_qp_root, the same reader reads per-peer
 * counters too (engine_paths.c: "p" and the fields after it).
 * Test hook: COLLBENCH_ENGINE_HOST_OF_RANK="hA,hA,hB,hB" names each world rank's host (several
 * emulated hosts on one machine); otherwise MPI_Get_processor_name.
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/statfs.h>
#include <sys/socket.h>
#include <netinet/in.h>

#include "collbench_engine.h"

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
    char qp_root[CONG_MAX_PATH];    /* per-QP counters (engine_paths.c); empty: none */
    int paths_tcp;                  /* the spec's "paths tcp": tcp_info per peer (engine_paths.c) */
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
    cong.qp_root[0] = '\0';
    cong.nnetdevs = 0;
    for (int i = 0; i + 1 < ntok; i += 2) {
        if (strcmp(tok[i], "sysfs_root") == 0)
            snprintf(cong.sysfs_root, sizeof(cong.sysfs_root), "%s", tok[i + 1]);
        else if (strcmp(tok[i], "netstat") == 0)
            snprintf(cong.netstat, sizeof(cong.netstat), "%s", tok[i + 1]);
        else if (strcmp(tok[i], "ethtool_root") == 0)
            snprintf(cong.ethtool_root, sizeof(cong.ethtool_root), "%s", tok[i + 1]);
        else if (strcmp(tok[i], "rdma_qp_root") == 0)
            snprintf(cong.qp_root, sizeof(cong.qp_root), "%s", tok[i + 1]);
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
        } else if (strcmp(tok[0], "paths") == 0) {
            for (int i = 1; i < ntok; i++)
                cong.paths_tcp |= strcmp(tok[i], "tcp") == 0;
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
int cong_setup(const char *spec_path, int rank, int nranks)
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
                            "defaults/host/rdma_hw/rdma_port/ethtool/netstat/paths\n", spec_path);
        return -1;
    }
    if (cong.reader)                /* collective over the readers */
        paths_setup(cong.paths_tcp, cong.qp_root, cong.leaders, cong.host);
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
void cong_before_step(int fresh)
{
    if (!cong.enabled || !cong.reader)
        return;
    if (cong.have_after && !fresh) {
        CongSnap t = cong.before;
        cong.before = cong.after;
        cong.after = t;
    } else
        cong_snapshot(&cong.before);
    paths_before(cong.have_after && !fresh);
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
    int keep = nmoved < CONG_MAX_MOVED ? nmoved : CONG_MAX_MOVED, plen = 0;
    const char *pfrag = paths_fragment(&plen);  /* ,"p":{...}: NULL without paths */
    size_t cap = 512 + (size_t)CONG_HOST_LEN * 6 + (size_t)keep * (CONG_MAX_KEY * 6 + 32) + (size_t)plen;
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
    n += (size_t)snprintf(out + n, cap - n, "}%s}", pfrag ? pfrag : "");
    free(moved);
    *len = (int)n;
    return out;
}

/* After the step: readers snapshot, their fragments go to rank 0, which prints the CBCONG line. */
void cong_after_step(int rank, int loop, int index)
{
    if (!cong.enabled || !cong.reader)
        return;
    double started = cong_mono();
    cong_snapshot(&cong.after);
    cong.snap_us = (cong_mono() - started) * 1e6;
    paths_after();                  /* timed on its own: "pus" */
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
