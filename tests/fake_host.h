/* A transport host of the tests' own (what the library gives a transport, without the
 * library): store calls on a file store under a prefix, knobs from a "NAME=VALUE,..."
 * list then the TUTTI_* environment, log lines to stderr, and errors recorded where a
 * test can read them. Shared by the tests that drive a transport's ops table. */
#ifndef TH_FAKE_HOST_H
#define TH_FAKE_HOST_H

#include <tutti/store.h>
#include <tutti/transport_v2.h>

typedef struct th_host {
    tutti_tp_host_v2_t h;
    tutti_store_t *base;   /* opened by th_host_open (NULL when the test gave a store) */
    tutti_store_t *store;  /* where the transport's keys go */
    const char *prefix;    /* put before every key the transport uses (NULL: none) */
    const char *knobs;     /* "NAME=VALUE,..." answered before the environment, or NULL */
    char knob_val[8][128]; /* the answers (the i-th entry's in [i]: they stay valid) */
    const char *secret;    /* the job secret for auth_answer (NULL: authentication off) */
    /* the last error the transport recorded, and how many */
    int nerr;
    int err_status;
    int err_peer;
    char err[4096];
} th_host_t;

/* Fill t for rank of nranks over store (not owned); the callbacks' ctx is t, so t must
 * stay where it is. peers may be NULL (every peer). */
void th_host_init(th_host_t *t, tutti_store_t *store, int rank, int nranks, int timeout_ms,
                  const unsigned char *peers);
/* th_host_init over a file store in dir, keys under prefix; 0 on success. */
int th_host_open(th_host_t *t, const char *dir, const char *prefix, int rank, int nranks,
                 int timeout_ms);
/* Close what th_host_open opened. */
void th_host_close(th_host_t *t);

/* A request to post: host memory, no handle, no stream; envelope (seq, fp, len, tag). */
void th_req_set(tutti_tp_req_v2_t *r, int peer, void *buf, size_t len, uint64_t seq, uint64_t fp,
                uint64_t tag);

#endif
