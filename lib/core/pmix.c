/* Rank 0's host from a PMIx launcher: see pmix.h.
 *
 * libpmix is loaded with dlopen (the build needs no PMIx headers, and a process that
 * never asks never loads it). The few types used are the PMIx standard's, fixed by it
 * across versions: a process name is a 256-byte namespace and a 32-bit rank; a value
 * starts with its 16-bit type, its data (here a string pointer) at offset 8. PMIx_Init
 * and PMIx_Finalize count their calls, so an MPI library in the same process that
 * initialized PMIx too keeps its connection. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/bounded.h"
#include "core/pmix.h"

typedef struct {
    char nspace[256];
    uint32_t rank;
} pmix_name_t;

typedef struct {
    uint16_t type;
    union {
        char *string;
        uint64_t pad[3];
    } data;
} pmix_val_t;

#define PMIX_OK 0
#define PMIX_TYPE_STRING 3
#define PMIX_KEY_HOSTNAME "pmix.hname"
#define NOT_A_NAME (-100000) /* a value that is no host name: not a PMIx status */

typedef int (*pmix_init_fn)(pmix_name_t *, void *, size_t);
typedef int (*pmix_get_fn)(const pmix_name_t *, const char *, const void *, size_t, pmix_val_t **);
typedef int (*pmix_fini_fn)(const void *, size_t);

/* One question, run bounded by the caller's timeout (base/bounded.h): the caller may
 * stop waiting while the thread is still inside libpmix. */
typedef struct ask {
    tt_bounded_t job;
    int rc;
    const char *step; /* what failed, when rc != 0 */
    char host[256];
    pmix_init_fn init;
    pmix_get_fn get;
    pmix_fini_fn fini;
    void (*destruct)(pmix_val_t *); /* PMIx_Value_destruct, where the library has it */
} ask_t;

static void ask_release(tt_bounded_t *job)
{
    free(job);
}

static void ask_run(tt_bounded_t *job)
{
    ask_t *a = (ask_t *)job;
    pmix_name_t me, r0;
    memset(&me, 0, sizeof(me));
    int rc = a->init(&me, NULL, 0);
    const char *step = "PMIx_Init";
    char host[256] = "";
    if (rc == PMIX_OK) {
        r0 = me;
        r0.rank = 0;
        pmix_val_t *v = NULL;
        rc = a->get(&r0, PMIX_KEY_HOSTNAME, NULL, 0, &v);
        step = "PMIx_Get of rank 0's " PMIX_KEY_HOSTNAME;
        if (rc == PMIX_OK &&
            (!v || v->type != PMIX_TYPE_STRING || !v->data.string || !v->data.string[0]))
            rc = NOT_A_NAME;
        else if (rc == PMIX_OK)
            snprintf(host, sizeof(host), "%s", v->data.string);
        if (v) { /* as PMIX_VALUE_RELEASE: its contents, then the value (malloc'd) */
            if (a->destruct)
                a->destruct(v);
            free(v);
        }
        a->fini(NULL, 0);
    }
    a->rc = rc;
    a->step = step;
    snprintf(a->host, sizeof(a->host), "%s", host);
}

int tt_pmix_rank0_host(char *out, size_t len, int timeout_ms, char *why, size_t whylen)
{
    if (!getenv("PMIX_NAMESPACE") || !getenv("PMIX_RANK")) {
        snprintf(why, whylen, "no PMIx launch (PMIX_NAMESPACE and PMIX_RANK unset)");
        return -1;
    }
    /* never closed: a thread that timed out may still be inside it */
    static void *lib;
    static pthread_mutex_t lib_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lib_lock);
    if (!lib)
        lib = dlopen("libpmix.so.2", RTLD_NOW | RTLD_LOCAL);
    void *h = lib;
    pthread_mutex_unlock(&lib_lock);
    if (!h) {
        snprintf(why, whylen, "libpmix.so.2 could not be loaded (%s)", dlerror());
        return -1;
    }
    ask_t *a = calloc(1, sizeof(*a));
    if (!a) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    *(void **)&a->init = dlsym(h, "PMIx_Init");
    *(void **)&a->get = dlsym(h, "PMIx_Get");
    *(void **)&a->fini = dlsym(h, "PMIx_Finalize");
    *(void **)&a->destruct = dlsym(h, "PMIx_Value_destruct");
    if (!a->init || !a->get || !a->fini) {
        snprintf(why, whylen, "libpmix.so.2 lacks PMIx_Init, PMIx_Get or PMIx_Finalize");
        free(a);
        return -1;
    }
    int done = tt_bounded_run(&a->job, ask_run, ask_release, tt_deadline_ns(timeout_ms));
    int rc = -1;
    if (done < 0)
        snprintf(why, whylen, "no thread to ask PMIx from: %s", strerror(-done));
    else if (!done)
        snprintf(why, whylen, "the PMIx server (PMIX_SERVER_URI*) gave no answer within %d ms",
                 timeout_ms);
    else if (a->rc == NOT_A_NAME)
        snprintf(why, whylen, "PMIx gave no host name for rank 0 (%s)", PMIX_KEY_HOSTNAME);
    else if (a->rc != PMIX_OK)
        snprintf(why, whylen, "%s failed (PMIx status %d)", a->step, a->rc);
    else {
        snprintf(out, len, "%s", a->host);
        rc = 0;
    }
    tt_bounded_put(&a->job);
    return rc;
}
