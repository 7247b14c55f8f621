/* NCCL's bootstrap by unique id (ncclGetUniqueId, ncclCommInitRank): one process makes an
 * id, the program hands it to every rank by its own means (MPI_Bcast, a file, a
 * launcher's argument), and each rank joins with it. The id is a tcp store: the maker
 * serves it (an embedded store server on an address of this host, chosen as the tcp
 * transport chooses its own: TUTTI_SOCKET_IFNAME, TUTTI_SOCKET_FAMILY), with a random
 * job secret that guards the store and every link (so only holders of the id get in)
 * and a random job id (so two ids' jobs never mix). The store serves the communicators
 * made from it for their lifetime (splits, shrinks, failure reports read it): the maker
 * holds the server until tutti_unique_id_release, and a communicator the maker made from
 * it holds it too. */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tutti/store.h>
#include <tutti/tutti.h>

#include "base/auth.h"
#include "base/base.h"
#include "core/fault.h"
#include "core/state.h"
#include "store/store_impl.h"
#include "../../transports/kit/util.h"

#define UID_MAGIC "tutti-uid1"

/* The ids this process made, with their servers (a forked child's copies are its
 * parent's: skipped by pid). */
typedef struct uid_made {
    struct uid_made *next;
    pid_t pid;
    tutti_unique_id_t id;
    tutti_store_t *server;
} uid_made_t;

static pthread_mutex_t uid_lock = PTHREAD_MUTEX_INITIALIZER;
static uid_made_t *uid_list;

typedef struct {
    char url[96], secret[40], job[40];
} uid_parts_t;

static int is_link_local6(const struct sockaddr_in6 *a)
{
    return a->sin6_addr.s6_addr[0] == 0xfe && (a->sin6_addr.s6_addr[1] & 0xc0) == 0x80;
}

/* This host's address for the id's server: an interface that is up and passes
 * TUTTI_SOCKET_IFNAME, a real one before loopback, IPv4 before IPv6 (TUTTI_SOCKET_FAMILY
 * 4 or 6: that family only), as the tcp transport chooses. */
static int choose_address(char *out, size_t len, int *v6_p)
{
    const char *spec = tp_socket_ifname_env(NULL);
    const char *fams = tt_env("SOCKET_FAMILY");
    char *end = NULL;
    long fam = fams ? strtol(fams, &end, 10) : 0;
    if (fams && (*end || (fam != 0 && fam != 4 && fam != 6)))
        return tt_thread_error_set(TUTTI_ERR_CONFIG,
                                   "get_unique_id: TUTTI_SOCKET_FAMILY=%.32s: expected 0 (either, "
                                   "IPv4 preferred), 4 (IPv4) or 6 (IPv6)",
                                   fams);
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) < 0)
        return tt_thread_error_set(TUTTI_ERR_NO_DEVICE,
                                   "get_unique_id: cannot list network interfaces: %s",
                                   strerror(errno));
    const struct ifaddrs *best = NULL;
    int best_score = -1;
    char seen[512] = "";
    for (const struct ifaddrs *a = ifs; a; a = a->ifa_next) {
        if (!a->ifa_addr || !(a->ifa_flags & IFF_UP) || !(a->ifa_flags & IFF_RUNNING))
            continue;
        int af = a->ifa_addr->sa_family;
        if (af != AF_INET && af != AF_INET6)
            continue;
        if (!strstr(seen, a->ifa_name) && strlen(seen) + strlen(a->ifa_name) + 3 < sizeof(seen)) {
            strcat(seen, seen[0] ? ", " : "");
            strcat(seen, a->ifa_name);
        }
        if ((fam == 4 && af != AF_INET) || (fam == 6 && af != AF_INET6))
            continue;
        if (af == AF_INET6 && is_link_local6((const struct sockaddr_in6 *)a->ifa_addr))
            continue; /* would need a scope id */
        if (spec && !tp_ifname_matches(spec, a->ifa_name))
            continue;
        int score = tp_ifaddr_score(a->ifa_name, a->ifa_flags & IFF_LOOPBACK, af == AF_INET);
        if (score > best_score)
            best = a, best_score = score;
    }
    int st = TUTTI_OK;
    if (!best) {
        const char *shown, *var = tp_socket_ifname_var(spec, &shown);
        st = tt_thread_error_set(TUTTI_ERR_NO_DEVICE,
                                 "get_unique_id: no interface matches %s=%s%s%s (interfaces: %s)",
                                 var, shown, fam ? " with TUTTI_SOCKET_FAMILY=" : "",
                                 fam ? fams : "", seen);
    } else {
        int v6 = best->ifa_addr->sa_family == AF_INET6;
        const void *in =
            v6 ? (const void *)&((const struct sockaddr_in6 *)best->ifa_addr)->sin6_addr
               : (const void *)&((const struct sockaddr_in *)best->ifa_addr)->sin_addr;
        inet_ntop(v6 ? AF_INET6 : AF_INET, in, out, (socklen_t)len);
        *v6_p = v6;
    }
    freeifaddrs(ifs);
    return st;
}

static void hex(char *out, const uint8_t *in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", in[i]);
}

/* The id's parts, or TUTTI_ERR_INVALID_ARG (said in the thread's error, by what) when
 * it is no id tutti_get_unique_id made. */
static int uid_parse(const tutti_unique_id_t *id, uid_parts_t *p, const char *what)
{
    char magic[16] = "";
    if (!memchr(id->internal, 0, sizeof(id->internal)) ||
        sscanf(id->internal, "%15s %95s %39s %39s", magic, p->url, p->secret, p->job) != 4 ||
        strcmp(magic, UID_MAGIC) || strncmp(p->url, "tcp://", 6) || strlen(p->secret) != 32)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                   "%s: the id is not one tutti_get_unique_id made (its %zu bytes "
                                   "must reach every rank unchanged)",
                                   what, sizeof(id->internal));
    return TUTTI_OK;
}

int tutti_get_unique_id(tutti_unique_id_t *id)
{
    if (!id)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "get_unique_id: id is NULL");
    memset(id, 0, sizeof(*id));
    char addr[INET6_ADDRSTRLEN];
    int v6 = 0;
    TT_CHECK(choose_address(addr, sizeof(addr), &v6));
    uint8_t rnd[24];
    if (tt_auth_random(rnd, sizeof(rnd)) < 0)
        return tt_thread_error_set(TUTTI_ERR_IO, "get_unique_id: no random bytes from the kernel");
    char secret[33], job[40] = "uid-";
    hex(secret, rnd, 16);
    hex(job + 4, rnd + 16, 8);
    uid_made_t *m = calloc(1, sizeof(*m));
    if (!m)
        return tt_thread_error_set(TUTTI_ERR_NOMEM, "get_unique_id: out of memory");
    tutti_store_opts_t so;
    tutti_store_opts_init(&so);
    so.is_server = 1;
    so.auth_token = secret;
    so.auth_token_file = NULL;
    so.instance = job; /* a client of this id keeps away from any other server */
    char url[96];
    snprintf(url, sizeof(url), v6 ? "tcp://[%s]:0" : "tcp://%s:0", addr);
    int st = tutti_store_open(&m->server, url, &so);
    if (st < 0) {
        free(m);
        return tt_thread_error_set(st, "get_unique_id: cannot serve a store at %s: %s", url,
                                   tutti_store_last_error(NULL));
    }
    snprintf(url, sizeof(url), v6 ? "tcp://[%s]:%d" : "tcp://%s:%d", addr,
             tutti_store_port(m->server));
    m->pid = getpid();
    snprintf(id->internal, sizeof(id->internal), "%s %s %s %s", UID_MAGIC, url, secret, job);
    m->id = *id;
    pthread_mutex_lock(&uid_lock);
    m->next = uid_list;
    uid_list = m;
    pthread_mutex_unlock(&uid_lock);
    TT_INFO("get_unique_id: serving the id's store at %s (job %s)", url, job);
    return TUTTI_OK;
}

/* The entry of id if this process made it (the whole id: one with another secret is
 * a stranger's, refused by the server as any client would be). */
static uid_made_t **made_entry(const tutti_unique_id_t *id)
{
    for (uid_made_t **pp = &uid_list; *pp; pp = &(*pp)->next)
        if ((*pp)->pid == getpid() &&
            !strncmp((*pp)->id.internal, id->internal, sizeof(id->internal)))
            return pp;
    return NULL;
}

/* This process's server of id (a reference of the caller's), or NULL. */
static tutti_store_t *made_here(const tutti_unique_id_t *id)
{
    tutti_store_t *s = NULL;
    pthread_mutex_lock(&uid_lock);
    uid_made_t **pp = made_entry(id);
    if (pp)
        s = tt_store_retain((*pp)->server);
    pthread_mutex_unlock(&uid_lock);
    return s;
}

int tutti_unique_id_release(const tutti_unique_id_t *id)
{
    uid_parts_t p;
    if (!id)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "unique_id_release: id is NULL");
    TT_CHECK(uid_parse(id, &p, "unique_id_release"));
    uid_made_t *found = NULL;
    pthread_mutex_lock(&uid_lock);
    uid_made_t **pp = made_entry(id);
    if (pp) {
        found = *pp;
        *pp = found->next;
    }
    pthread_mutex_unlock(&uid_lock);
    if (!found)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                   "unique_id_release: the id of %s was not made by this process "
                                   "(or was released already)",
                                   p.url);
    tutti_store_close(found->server); /* (its communicators here keep it until destroyed) */
    free(found);
    return TUTTI_OK;
}

int tutti_comm_init_rank(tutti_comm_t **comm_p, int nranks, const tutti_unique_id_t *id, int rank,
                         const tutti_comm_opts_t *opts)
{
    if (!comm_p || !id)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "tutti_comm_init_rank: %s is NULL",
                                   comm_p ? "id" : "comm_p");
    *comm_p = NULL;
    uid_parts_t p;
    TT_CHECK(uid_parse(id, &p, "tutti_comm_init_rank"));
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG,
                                   "tutti_comm_init_rank: rank %d is not in [0, %d)", rank, nranks);
    tutti_comm_opts_t o, env;
    tutti_comm_opts_init(&o);
    env = o; /* what the environment gives, which an opts of tutti_comm_opts_init holds */
    size_t n = opts && opts->size && opts->size < sizeof(o) ? opts->size : sizeof(o);
    if (opts)
        memcpy(&o, opts, n);
    o.size = sizeof(o);
    /* The id names the job and holds its secret, unless the caller's options name their
     * own: a value set there, not the environment's (which may differ between ranks: the
     * maker outside a launcher, the others under one) */
#define TT_UID_OWN(f)                                                                              \
    (opts && n >= offsetof(tutti_comm_opts_t, f) + sizeof(char *) && opts->f && *opts->f &&        \
     (!env.f || strcmp(opts->f, env.f)))
    if (!TT_UID_OWN(job_id))
        o.job_id = p.job;
    if (!TT_UID_OWN(auth_token) && !TT_UID_OWN(auth_token_file)) {
        o.auth_token = p.secret;
        o.auth_token_file = NULL;
    }
#undef TT_UID_OWN
    /* A client of its own, in the maker too: communicators made through one store
     * handle are numbered in the order of their inits, so ranks that are threads of one
     * process sharing the server's handle took each other's numbers (found by a test of
     * ranks as threads). The maker's communicator also holds the server. */
    tutti_store_t *store = NULL, *server = made_here(id);
    tutti_store_opts_t so;
    tutti_store_opts_init(&so);
    so.auth_token = p.secret;
    so.auth_token_file = NULL;
    so.instance = p.job;
    if (!tt_env("STORE_TIMEOUT_MS"))
        so.timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : so.timeout_ms;
    int st = tutti_store_open(&store, p.url, &so);
    if (st < 0) {
        if (server)
            tutti_store_close(server);
        return tt_thread_error_set(st,
                                   "tutti_comm_init_rank: rank %d of %d: cannot reach the id's "
                                   "store %s (served by the process that called "
                                   "tutti_get_unique_id, until it releases the id or exits): %s",
                                   rank, nranks, p.url, tutti_store_last_error(NULL));
    }
    st = tutti_comm_init(comm_p, store, rank, nranks, &o);
    if (st < 0) {
        tutti_store_close(store);
        if (server)
            tutti_store_close(server);
        return st;
    }
    (*comm_p)->uid_store = store;
    (*comm_p)->uid_server = server;
    return TUTTI_OK;
}

/* ---- ncclCommInitAll: every rank of a job in this process ---- */

typedef struct {
    tutti_comm_t **comm_p;
    const tutti_unique_id_t *id;
    const tutti_comm_opts_t *opts;
    int rank, nranks, status;
    char error[TT_ERRMSG_LEN]; /* its thread's error (the thread's own, read there) */
} init_all_part_t;

static void *init_all_rank(void *arg)
{
    init_all_part_t *a = arg;
    a->status = tutti_comm_init_rank(a->comm_p, a->nranks, a->id, a->rank, a->opts);
    if (a->status < 0)
        snprintf(a->error, sizeof(a->error), "%s", tt_thread_error());
    return NULL;
}

int tutti_comm_init_all(tutti_comm_t **comms, int n, const tutti_comm_opts_t *opts)
{
    if (!comms || n < 1)
        return tt_thread_error_set(TUTTI_ERR_INVALID_ARG, "tutti_comm_init_all: %s",
                                   !comms ? "comms is NULL" : "n must be 1 or more");
    for (int i = 0; i < n; i++)
        comms[i] = NULL;
    tutti_unique_id_t id;
    TT_CHECK(tutti_get_unique_id(&id));
    init_all_part_t *parts = calloc((size_t)n, sizeof(*parts));
    pthread_t *threads = calloc((size_t)n, sizeof(*threads));
    int st = parts && threads ? TUTTI_OK : TUTTI_ERR_NOMEM, started = 0;
    /* a thread a rank: each init waits for the others' */
    for (int i = 0; st == TUTTI_OK && i < n; i++) {
        parts[i] = (init_all_part_t){
            .comm_p = &comms[i], .id = &id, .opts = opts, .rank = i, .nranks = n
        };
        if (pthread_create(&threads[i], NULL, init_all_rank, &parts[i]) != 0)
            st = TUTTI_ERR_NOMEM;
        else
            started++;
    }
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    int bad = -1;
    for (int i = 0; st == TUTTI_OK && i < n; i++)
        if (parts[i].status < 0 && bad < 0)
            bad = i;
    if (st < 0 || bad >= 0) {
        /* none is left: a failed init leaves nothing, the others are destroyed (those
         * that were made are ranks of a job that cannot run) */
        for (int i = 0; i < n; i++) {
            tutti_comm_destroy(comms[i]);
            comms[i] = NULL;
        }
        if (st < 0)
            tt_thread_error_set(st, "tutti_comm_init_all: cannot start %d threads", n);
        else
            st = tt_thread_error_set(parts[bad].status, "tutti_comm_init_all: rank %d of %d: %s",
                                     bad, n, parts[bad].error);
    }
    free(parts);
    free(threads);
    tutti_unique_id_release(&id); /* (each communicator holds the server) */
    return st;
}
