/* Transport kit: the monotonic clock, TUTTI_* knobs read through the host, this host's
 * identity, and TT_KIT_MIN/TT_KIT_MAX (the kit's TT_MIN: transports do not see lib/base). */
#ifndef TT_KIT_UTIL_H
#define TT_KIT_UTIL_H

#include <dirent.h>
#include <pthread.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <tutti/transport_v1.h>

#define TT_KIT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TT_KIT_MAX(a, b) ((a) > (b) ? (a) : (b))

/* This process's pid namespace: the inode number of /proc/self/ns/pid (unique on the
 * host), or 0 when /proc cannot say. (lib/ uses it too.) */
static inline unsigned long long tp_pidns(void)
{
    struct stat sb;
    return stat("/proc/self/ns/pid", &sb) == 0 ? (unsigned long long)sb.st_ino : 0;
}

/* /proc/<pid>/stat read into buf: a pointer to its field 3 (the state), or NULL when the
 * process is gone. The command (field 2) may hold spaces and parentheses: the fields
 * after it count from its last ')'. */
static inline const char *tp_proc_stat(long pid, char *buf, size_t len)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] ? p + 2 : NULL;
}

/* Field `field` (3 or more, as proc(5) numbers them) of what tp_proc_stat returned, or
 * NULL when the line is shorter. */
static inline const char *tp_stat_field(const char *f3, int field)
{
    for (int f = 3; f3 && f < field; f++)
        if ((f3 = strchr(f3, ' ')))
            f3++;
    return f3 && *f3 ? f3 : NULL;
}

static inline uint64_t tp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Knob TUTTI_<name> as an integer (strtol base 0) within [lo, hi]. 0 with *out set
 * (def when unset); TUTTI_ERR_CONFIG when it is set but not such a number (*out = def,
 * *raw_p the text): the caller decides whether that is fatal. */
static inline int tp_knob_long(const tutti_tp_host_v1_t *h, const char *name, long def, long lo,
                               long hi, long *out, const char **raw_p)
{
    const char *v = h->config(h->ctx, name);
    *out = def;
    if (raw_p)
        *raw_p = v;
    if (!v || !*v)
        return TUTTI_OK;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 0);
    if (errno || end == v || *end || x < lo || x > hi)
        return TUTTI_ERR_CONFIG;
    *out = x;
    return TUTTI_OK;
}

/* The one grammar of a size, for every TUTTI_* size the library or a transport reads
 * (lib's tt_parse_size is this): decimal digits, then optionally K, M or G in either case
 * (powers of 1024) and a B after it ("4096", "64K", "1M", "2gb"); nothing else (no sign,
 * hex, fraction or space). 0 with *out set, or -1 (*out untouched). */
static inline int tp_parse_size(const char *s, size_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned shift = 0;
    switch (*end) {
    case 'k':
    case 'K': shift = 10; break;
    case 'm':
    case 'M': shift = 20; break;
    case 'g':
    case 'G': shift = 30; break;
    default: break;
    }
    if (shift && (*++end == 'B' || *end == 'b'))
        end++;
    if (errno || *end || v > ((unsigned long long)SIZE_MAX >> shift))
        return -1;
    *out = (size_t)(v << shift);
    return 0;
}

/* Knob TUTTI_<name> as a size (tp_parse_size) within [lo, hi]. 0 with *out set (def when
 * unset); TUTTI_ERR_CONFIG when it is set but not such a size (*out = def, *raw_p the
 * text): the caller decides whether that is fatal. */
static inline int tp_knob_bytes(const tutti_tp_host_v1_t *h, const char *name, size_t def,
                                size_t lo, size_t hi, size_t *out, const char **raw_p)
{
    const char *v = h->config(h->ctx, name);
    size_t x;
    *out = def;
    if (raw_p)
        *raw_p = v;
    if (!v || !*v)
        return TUTTI_OK;
    if (tp_parse_size(v, &x) < 0 || x < lo || x > hi)
        return TUTTI_ERR_CONFIG;
    *out = x;
    return TUTTI_OK;
}

/* Knob TUTTI_<name> as a size (tp_parse_size), at most 1 TiB; a value that is not one is
 * warned about and def used (def_name, when set, is what the warning calls def: "auto"). */
static inline size_t tp_knob_size_named(const tutti_tp_host_v1_t *h, const char *name, size_t def,
                                        const char *def_name)
{
    size_t x;
    const char *v;
    if (tp_knob_bytes(h, name, def, 0, (size_t)1 << 40, &x, &v) < 0) {
        char num[32];
        snprintf(num, sizeof(num), "%zu", def);
        h->log(h->ctx, TUTTI_LOG_WARN,
               "TUTTI_%s=%s is not a size (digits, then K, M or G; at most 1T); using %s", name, v,
               def_name ? def_name : num);
    }
    return x;
}

static inline size_t tp_knob_size(const tutti_tp_host_v1_t *h, const char *name, size_t def)
{
    return tp_knob_size_named(h, name, def, NULL);
}

/* TUTTI_BIND=none (the bind field of the options): the transport moves none of the
 * threads that wait in it off a CPU (shm's and tcp's moves off a CPU shared with a peer):
 * they stay where the kernel, or the caller's affinity, puts them. */
static inline int tp_bind_none(const tutti_tp_host_v1_t *h)
{
    const char *v = h->config(h->ctx, "BIND");
    return v && !strcmp(v, "none");
}

/* Room for more open files, per_peer[0] to per_peer[1] for each of `npeers` peers and
 * `own` of the set-up's own, under RLIMIT_NOFILE, counting what /proc/self/fd holds now:
 * where the soft limit is short of the most, it is raised toward the hard one (as MPI
 * launchers do) and the log says so. 0, or -1 with why (what: the transport's name)
 * saying the counts and the way out where even the hard limit is short of the least:
 * set-up would fail with EMFILE half-way, where its peers cannot learn why. Passes where
 * it cannot count. */
static inline int tp_fd_room(const tutti_tp_host_v1_t *h, const char *what, int npeers,
                             const int per_peer[2], int own, char *why, size_t len)
{
    struct rlimit rl;
    DIR *d;
    if (npeers < 1 || getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY ||
        !(d = opendir("/proc/self/fd")))
        return 0;
    long open_now = -1; /* the directory's own descriptor is not the process's */
    for (struct dirent *e; (e = readdir(d));)
        open_now += e->d_name[0] != '.';
    closedir(d);
    rlim_t base = (rlim_t)(open_now > 0 ? open_now : 0) + (rlim_t)own;
    rlim_t least = base + (rlim_t)npeers * (rlim_t)per_peer[0];
    rlim_t most = base + (rlim_t)npeers * (rlim_t)per_peer[1];
    if (most <= rl.rlim_cur)
        return 0;
    if (rl.rlim_max != RLIM_INFINITY && least > rl.rlim_max) {
        snprintf(why, len,
                 "%s: %d peers need at least %llu more open files (%d each), %ld are open and "
                 "the limit is %llu (ulimit -n; hard limit %llu, ulimit -Hn): raise it, or run "
                 "fewer ranks",
                 what, npeers, (unsigned long long)(least - (rlim_t)(open_now > 0 ? open_now : 0)),
                 per_peer[0], open_now, (unsigned long long)rl.rlim_cur,
                 (unsigned long long)rl.rlim_max);
        return -1;
    }
    rlim_t was = rl.rlim_cur, want = most + 12;
    rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && want > rl.rlim_max ? rl.rlim_max : want;
    if (rl.rlim_cur <= was)
        return 0; /* the hard limit is the soft one: set-up may still fit */
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
        h->log(h->ctx, TUTTI_LOG_WARN,
               "%s: %d peers may need up to %llu open files, and the limit of %llu could not "
               "be raised (%s): raise it (ulimit -n) if set-up runs out",
               what, npeers, (unsigned long long)most, (unsigned long long)was, strerror(errno));
        return 0;
    }
    h->log(h->ctx, TUTTI_LOG_INFO,
           "%s: raised this process's limit of open files from %llu to %llu for %d peers "
           "(%d each; the hard limit is %llu)",
           what, (unsigned long long)was, (unsigned long long)rl.rlim_cur, npeers, per_peer[1],
           (unsigned long long)rl.rlim_max);
    return 0;
}

/* Does interface `name` pass TUTTI_SOCKET_IFNAME's spec: prefixes "eth,ib", "^lo"
 * excludes those, "=eth0" exact names (NCCL_SOCKET_IFNAME's syntax)? (lib/ uses it too:
 * the unique id's address.) */
static inline int tp_ifname_matches(const char *spec, const char *name)
{
    int exclude = spec[0] == '^';
    const char *p = spec + exclude;
    int exact = p[0] == '=';
    p += exact;
    int hit = 0;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n && (exact ? (strlen(name) == n && !strncmp(name, p, n)) : !strncmp(name, p, n)))
            hit = 1;
        p += n + (e ? 1 : 0);
    }
    return exclude ? !hit : hit;
}

/* GLOO_SOCKET_IFNAME as this syntax reads it: its exact names ("eth0,eth1", as gloo and
 * torch take them) behind "=" (fixed at the first read, as the process's environment). */
static char tp_gloo_ifname[256];
static pthread_once_t tp_gloo_once = PTHREAD_ONCE_INIT;
static inline void tp_gloo_ifname_read(void)
{
    const char *g = getenv("GLOO_SOCKET_IFNAME");
    if (g && *g)
        snprintf(tp_gloo_ifname, sizeof(tp_gloo_ifname), "=%s", g);
}

/* TUTTI_SOCKET_IFNAME, else NCCL's NCCL_SOCKET_IFNAME (the same syntax), else Gloo's
 * (torch's gloo backend's) GLOO_SOCKET_IFNAME (exact names): the first set (not empty),
 * NULL if none; *var_p the variable's name. */
static inline const char *tp_socket_ifname_env(const char **var_p)
{
    static const char *const vars[] = { "TUTTI_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME" };
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) {
            if (var_p)
                *var_p = vars[i];
            return v;
        }
    }
    pthread_once(&tp_gloo_once, tp_gloo_ifname_read);
    if (var_p)
        *var_p = tp_gloo_ifname[0] ? "GLOO_SOCKET_IFNAME" : vars[0];
    return tp_gloo_ifname[0] ? tp_gloo_ifname : NULL;
}

/* The variable spec (an interface choice in force) came from, for messages: where
 * TUTTI_SOCKET_IFNAME is unset and a peer's variable holds spec, that one; *shown_p
 * spec as that variable has it. */
static inline const char *tp_socket_ifname_var(const char *spec, const char **shown_p)
{
    const char *var, *v = tp_socket_ifname_env(&var);
    *shown_p = spec ? spec : "(unset)";
    if (!v || !spec || strcmp(v, spec))
        return "TUTTI_SOCKET_IFNAME";
    if (v == tp_gloo_ifname)
        *shown_p = spec + 1;
    return var;
}

/* How much the address choice wants an interface (the higher the better): loopback
 * 0; a container's, a VM bridge's or a virtual link's 1 (docker, veth, virbr, br-, cni,
 * flannel, cali, vxlan, lxc, podman, tun, tap: peers on other hosts rarely reach
 * them); any other 2; InfiniBand's IPoIB (ib) 3, as NCCL orders them; then IPv4 over
 * IPv6. Ties: the first listed. */
static inline int tp_ifaddr_score(const char *name, int loopback, int v4)
{
    static const char *const virt[] = { "docker", "veth",  "virbr", "br-",    "cni", "flannel",
                                        "cali",   "vxlan", "lxc",   "podman", "tun", "tap" };
    int cls = 2;
    if (loopback)
        cls = 0;
    else if (!strncmp(name, "ib", 2))
        cls = 3;
    else
        for (size_t i = 0; i < sizeof(virt) / sizeof(virt[0]); i++)
            if (!strncmp(name, virt[i], strlen(virt[i])))
                cls = 1;
    return 2 * cls + (v4 ? 1 : 0);
}

/* This host's identity when nothing better is given: hostname and boot id (ranks with
 * equal ids share a kernel). override, when set, wins. */
static inline void tp_host_id_fallback(const char *override, char *out, size_t len)
{
    if (override && *override) {
        snprintf(out, len, "%s", override);
        return;
    }
    char host[256] = "?";
    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = 0;
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof(boot), f))
            boot[0] = 0;
        fclose(f);
        boot[strcspn(boot, "\n")] = 0;
    }
    snprintf(out, len, "%s/%s", host, boot);
}

#endif
