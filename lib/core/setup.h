/* Set-up waits that end when another rank's set-up failed (session 95): the rank that
 * failed offers its reason under "<nonce>/init_failed_first" (job.c, tt_job_init_failed);
 * these read it. docs/architecture.md, "Job identity". */
#ifndef TT_SETUP_H
#define TT_SETUP_H

#include <stddef.h>

#include <tutti/store.h>
#include <tutti/tutti.h>

/* The value of key in store if it exists now: a check, then a get that answers at once
 * (TUTTI_ERR_NOT_FOUND when it does not exist). */
int tt_store_get_now(tutti_store_t *store, const char *key, void **value_p, size_t *len_p);

/* During set-up (comm->in_setup): the status of a peer of this instance that failed its
 * own set-up and said why (tt_job_init_failed), its reason kept in comm->setup_peer_why;
 * 0 while none has (one store check a call; the answer sticks once found). */
int tt_setup_peer_failed(tutti_comm_t *comm);

/* Store waits of set-up (comm->in_setup) that also watch for a peer of this instance
 * failing its own set-up (tt_job_init_failed): the wait goes in slices, between which
 * one store check asks whether any rank left a failure. Then it ends with that rank's
 * status, kept with "rank R failed its set-up: <its reason>" in comm->setup_peer_* (the
 * init's error names it), instead of waiting out the timeout for a rank that will not
 * come. Otherwise as tutti_store_get / tutti_store_multi_get on store. A multi_get that
 * times out names the keys still missing (the store's last error): by owner and index
 * ("missing those of rank 2, rank 5") where keys[i] belongs to <owner> i, else by key. */
int tt_init_store_get(tutti_comm_t *comm, tutti_store_t *store, const char *key, void **value_p,
                      size_t *len_p, int timeout_ms);
int tt_init_store_multi_get(tutti_comm_t *comm, tutti_store_t *store, const char *const *keys,
                            size_t n, void **values_p, size_t *lens_p, int timeout_ms,
                            const char *owner);

#endif /* TT_SETUP_H */
