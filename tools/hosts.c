/* tools/hosts.c: the hosts of tutti-run -H / --hostfile (hosts.h). */
#include "hosts.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli.h"
#include "base/hostlist.h"

/* The most slots of one entry, and of one host over all its entries. */
#define TT_HOSTS_MAX_SLOTS (1 << 20)

/* Adds slots on host name (len bytes), as user (ulen bytes, 0: none). 0 or -1 (said). */
static int add_host(const char *tool, const char *user, size_t ulen, const char *name, size_t len,
                    int slots, tt_host_t **hosts, int *n)
{
    if (len == 0 || (ulen ? ulen + 1 : 0) + len >= sizeof((*hosts)->name)) {
        fprintf(stderr, "%s: a host name of %zu characters: expected 1..%zu\n", tool, len,
                sizeof((*hosts)->name) - 1 - (ulen ? ulen + 1 : 0));
        return -1;
    }
    char full[sizeof((*hosts)->name)];
    int at = ulen ? snprintf(full, sizeof(full), "%.*s@", (int)ulen, user) : 0;
    snprintf(full + at, sizeof(full) - (size_t)at, "%.*s", (int)len, name);
    /* the same host twice adds its slots: the same name, or two names of this host
     * (localhost and its own name, say), which would otherwise be two nodes on one,
     * each with LOCAL_RANK 0. Each name is asked once whether it is local. */
    int local = tt_host_is_local(full + at);
    for (int i = 0; i < *n; i++) {
        tt_host_t *o = &(*hosts)[i];
        if (!strcmp(tt_host_addr(o), full + at) || (local && o->local)) {
            /* one host, one node: under one user (a second would be a second node
             * there, each numbering its ranks from LOCAL_RANK 0) */
            if (!local && strcmp(o->name, full)) {
                fprintf(stderr, "%s: host %s named as %s and as %s: give it one user\n", tool,
                        full + at, o->name, full);
                return -1;
            }
            /* the per-entry cap holds for the host's total too (repeated entries
             * would otherwise overflow it) */
            if (o->slots > TT_HOSTS_MAX_SLOTS - slots) {
                fprintf(stderr,
                        "%s: host %s given %d slots in all, and %d more: at most %d on a "
                        "host\n",
                        tool, full + at, o->slots, slots, TT_HOSTS_MAX_SLOTS);
                return -1;
            }
            o->slots += slots;
            return 0;
        }
    }
    tt_host_t *h = realloc(*hosts, (size_t)(*n + 1) * sizeof(*h));
    if (!h) {
        fprintf(stderr, "%s: out of memory\n", tool);
        return -1;
    }
    *hosts = h;
    h = &h[(*n)++];
    memset(h, 0, sizeof(*h));
    memcpy(h->name, full, sizeof(full));
    h->at = at;
    h->slots = slots;
    h->local = local;
    return 0;
}

static int parse_slots(const char *s, size_t len, int *slots)
{
    char buf[16];
    if (len == 0 || len >= sizeof(buf))
        return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    return tt_cli_int(buf, 1, TT_HOSTS_MAX_SLOTS, slots);
}

int tt_hosts_parse(const char *tool, const char *list, tt_host_t **hosts, int *n)
{
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        /* [USER@]HOST[:SLOTS]; an IPv6 address in brackets: [USER@][ADDR][:SLOTS] */
        const char *user = p, *at = memchr(p, '@', len);
        size_t ulen = 0;
        if (at) {
            ulen = (size_t)(at - p);
            if (!ulen || memchr(at + 1, '@', (size_t)(p + len - at - 1))) {
                fprintf(stderr, "%s: -H %.*s: expected USER@HOST\n", tool, (int)len, p);
                return -1;
            }
            len -= ulen + 1;
            p = at + 1;
        }
        const char *name = p, *colon = NULL;
        size_t nlen = len;
        if (*p == '[') {
            const char *rb = memchr(p, ']', len);
            if (!rb) {
                fprintf(stderr, "%s: -H %s: an unclosed '['\n", tool, list);
                return -1;
            }
            name = p + 1;
            nlen = (size_t)(rb - name);
            colon = rb + 1 < p + len ? rb + 1 : NULL;
            if (colon && *colon != ':') { /* [ADDR]junk */
                fprintf(stderr, "%s: -H %.*s: expected [ADDRESS] or [ADDRESS]:SLOTS\n", tool,
                        (int)len, p);
                return -1;
            }
        } else {
            colon = memchr(p, ':', len);
            if (colon)
                nlen = (size_t)(colon - p);
        }
        int slots = 1;
        if (colon && parse_slots(colon + 1, (size_t)(p + len - colon - 1), &slots) < 0) {
            fprintf(stderr, "%s: -H %.*s: expected HOST or HOST:SLOTS (SLOTS 1 or more)\n", tool,
                    (int)len, p);
            return -1;
        }
        if (add_host(tool, user, ulen, name, nlen, slots, hosts, n) < 0)
            return -1;
        p = end ? end + 1 : p + len;
    }
    if (*n == 0) {
        fprintf(stderr, "%s: -H '%s': no host\n", tool, list);
        return -1;
    }
    return 0;
}

int tt_hosts_read(const char *tool, const char *path, tt_host_t **hosts, int *n)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        fprintf(stderr, "%s: --hostfile %s: %s\n", tool, path, strerror(errno));
        return -1;
    }
    char line[1024];
    int lineno = 0, st = 0, before = *n;
    while (st == 0 && fgets(line, sizeof(line), f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *tok = strtok(line, " \t\r\n");
        if (!tok)
            continue;
        int slots = 1;
        char *user = tok, *at = strchr(tok, '@'); /* USER@HOST, as Open MPI's */
        size_t ulen = at ? (size_t)(at - tok) : 0;
        if (at) {
            tok = at + 1;
            if (!ulen || strchr(tok, '@')) {
                fprintf(stderr, "%s: --hostfile %s line %d: expected USER@HOST\n", tool, path,
                        lineno);
                st = -1;
                break;
            }
        }
        char *colon = strchr(tok, ':');
        if (tok[0] == '[') { /* [v6] or [v6]:SLOTS */
            char *rb = strchr(tok, ']');
            colon = rb && rb[1] == ':' ? rb + 1 : NULL;
            if (!rb || (rb[1] && !colon)) {
                fprintf(stderr,
                        "%s: --hostfile %s line %d: expected [ADDRESS] or "
                        "[ADDRESS]:SLOTS\n",
                        tool, path, lineno);
                st = -1;
                break;
            }
        }
        char *more = strtok(NULL, " \t\r\n");
        if (colon) {
            *colon = '\0';
            if (parse_slots(colon + 1, strlen(colon + 1), &slots) < 0)
                more = "?";
        }
        /* Open MPI's slots=N (max_slots=M, a limit on oversubscribing, is taken and
         * not used: ranks never go past the slots here) */
        for (int k = 0; k < 2 && more; k++) {
            int m;
            if (!strncmp(more, "slots=", 6))
                more = parse_slots(more + 6, strlen(more + 6), &slots) < 0
                           ? "?"
                           : strtok(NULL, " \t\r\n");
            else if (!strncmp(more, "max_slots=", 10))
                more = parse_slots(more + 10, strlen(more + 10), &m) < 0 ? "?"
                                                                         : strtok(NULL, " \t\r\n");
        }
        if (more) {
            fprintf(stderr,
                    "%s: --hostfile %s line %d: expected HOST, HOST:SLOTS or HOST slots=N\n", tool,
                    path, lineno);
            st = -1;
            break;
        }
        if (tok[0] == '[') { /* [v6]: the address */
            *strchr(tok, ']') = '\0';
            tok++;
        }
        st = add_host(tool, user, ulen, tok, strlen(tok), slots, hosts, n);
    }
    fclose(f);
    if (st == 0 && *n == before) {
        fprintf(stderr, "%s: --hostfile %s: no host\n", tool, path);
        st = -1;
    }
    return st;
}

typedef struct slurm_walk {
    const char *tool;
    tt_host_t **hosts;
    int *n;
    const char *tasks, *me; /* the slots' list where the next node's are; SLURMD_NODENAME */
    int repeat, slots;      /* the current "S(xR)": R nodes left of S slots */
    int nodes, bad;
} slurm_walk_t;

/* The next node's slots from "S(xR),S,..." into w->slots. 0 or -1. */
static int next_slots(slurm_walk_t *w)
{
    if (w->repeat > 0) {
        w->repeat--;
        return 0;
    }
    char *end;
    long s = strtol(w->tasks, &end, 10);
    long r = 1;
    if (end == w->tasks || s < 1 || s > 1 << 20)
        return -1;
    if (!strncmp(end, "(x", 2)) {
        char *e2;
        r = strtol(end + 2, &e2, 10);
        if (e2 == end + 2 || r < 1 || *e2 != ')')
            return -1;
        end = e2 + 1;
    }
    if (*end && *end != ',')
        return -1;
    w->tasks = *end ? end + 1 : end;
    w->slots = (int)s;
    w->repeat = (int)r - 1;
    return 0;
}

static int slurm_node(void *ctx, const char *host)
{
    slurm_walk_t *w = ctx;
    if (++w->nodes > 1 << 16 || next_slots(w) < 0) {
        w->bad = 1;
        return 1;
    }
    int before = *w->n;
    if (add_host(w->tool, NULL, 0, host, strlen(host), w->slots, w->hosts, w->n) < 0) {
        w->bad = 2;
        return 1;
    }
    /* Slurm's node name may be other than the host's own name */
    if (*w->n > before && w->me && !strcmp(host, w->me))
        (*w->hosts)[*w->n - 1].local = 1;
    return 0;
}

int tt_hosts_slurm(const char *tool, tt_host_t **hosts, int *n)
{
    const char *list = getenv("SLURM_JOB_NODELIST") ? getenv("SLURM_JOB_NODELIST")
                                                    : getenv("SLURM_NODELIST");
    const char *tasks = getenv("SLURM_TASKS_PER_NODE");
    if (!list || !tasks) {
        fprintf(stderr, "%s: a Slurm job without %s: its nodes are not known\n", tool,
                !list ? "SLURM_JOB_NODELIST" : "SLURM_TASKS_PER_NODE");
        return -1;
    }
    slurm_walk_t w = { tool, hosts, n, tasks, getenv("SLURMD_NODENAME"), 0, 0, 0, 0 };
    int got = tt_hostlist_each(list, slurm_node, &w);
    if (w.bad == 2)
        return -1;
    if (got < 0 || w.bad || w.repeat || *w.tasks) {
        fprintf(stderr,
                "%s: the Slurm job's nodes SLURM_JOB_NODELIST=%.200s and their tasks "
                "SLURM_TASKS_PER_NODE=%.200s do not parse, or do not match (at most 65536 "
                "nodes)\n",
                tool, list, tasks);
        return -1;
    }
    return 0;
}

int tt_hosts_place(const char *tool, tt_host_t *hosts, int n, int *np_p)
{
    long total = 0;
    for (int i = 0; i < n; i++)
        total += hosts[i].slots;
    if (*np_p == 0)
        *np_p = total > 1 << 20 ? 1 << 20 : (int)total;
    if (*np_p > total) {
        fprintf(stderr, "%s: -np %d: the hosts have %ld slot(s) in all (HOST:SLOTS gives more)\n",
                tool, *np_p, total);
        return -1;
    }
    int left = *np_p, next = 0;
    for (int i = 0; i < n; i++) {
        hosts[i].nranks = left < hosts[i].slots ? left : hosts[i].slots;
        hosts[i].first = next;
        next += hosts[i].nranks;
        left -= hosts[i].nranks;
    }
    return 0;
}

int tt_host_is_local(const char *name)
{
    char me[256] = "";
    if (!strcmp(name, "localhost"))
        return 1;
    if (gethostname(me, sizeof(me) - 1) == 0 && !strcmp(name, me))
        return 1;
    /* an address: loopback, or one of this host's interfaces */
    struct addrinfo hints = { .ai_flags = AI_NUMERICHOST }, *ai = NULL;
    if (getaddrinfo(name, NULL, &hints, &ai) != 0 || !ai)
        return 0;
    int local = 0;
    if (ai->ai_family == AF_INET)
        local = (ntohl(((struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    else if (ai->ai_family == AF_INET6)
        local = IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr);
    struct ifaddrs *ifs = NULL;
    if (!local && getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != ai->ai_family)
                continue;
            if (ai->ai_family == AF_INET)
                local = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr ==
                        ((struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr;
            else
                local = !memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
                                &((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr,
                                sizeof(struct in6_addr));
        }
        freeifaddrs(ifs);
    }
    freeaddrinfo(ai);
    return local;
}

char *tt_shell_join(char *const *argv)
{
    size_t cap = 1;
    for (int i = 0; argv[i]; i++)
        cap += 4 * strlen(argv[i]) + 3;
    char *out = malloc(cap), *w = out;
    if (!out)
        return NULL;
    for (int i = 0; argv[i]; i++) {
        const char *a = argv[i];
        int plain = *a != '\0';
        for (const char *c = a; *c && plain; c++)
            plain = isalnum((unsigned char)*c) || strchr("@%+=:,./_-", *c);
        if (i)
            *w++ = ' ';
        if (plain) {
            w = stpcpy(w, a);
            continue;
        }
        *w++ = '\'';
        for (const char *c = a; *c; c++) {
            if (*c == '\'')
                w = stpcpy(w, "'\\''");
            else
                *w++ = *c;
        }
        *w++ = '\'';
    }
    *w = '\0';
    return out;
}
