/* Transport kit: the first and last steps of a transport's context, for contexts with
 * host, rank, nranks and links (nranks of them, each knowing its tp and peer). */
#ifndef TT_KIT_CTX_H
#define TT_KIT_CTX_H

#include <stddef.h>
#include <stdlib.h>

#include "abi.h"

/* create()'s checks and allocations: host is of ABI 1.0 or later (fields appended since
 * are looked up with tutti_tp_host_has); a zeroed context of tp_size bytes, and nranks
 * zeroed links of link_size bytes in *links_p. NULL with *st_p TUTTI_ERR_PLUGIN or
 * TUTTI_ERR_NOMEM (nothing allocated), else *st_p is TUTTI_OK. */
static inline void *tp_ctx_alloc(const tp_host_t *host, size_t tp_size, size_t link_size,
                                 void **links_p, int *st_p)
{
    if (!host || host->size < offsetof(tutti_tp_host_v1_t, peers) ||
        host->abi_version != TUTTI_TRANSPORT_ABI_V1) {
        *st_p = TUTTI_ERR_PLUGIN;
        return NULL;
    }
    void *tp = calloc(1, tp_size), *links = calloc((size_t)host->nranks, link_size);
    if (!tp || !links) {
        free(tp);
        free(links);
        *st_p = TUTTI_ERR_NOMEM;
        return NULL;
    }
    *links_p = links;
    *st_p = TUTTI_OK;
    return tp;
}

/* tp (a pointer to the context type) from tp_ctx_alloc, with host, rank, nranks and links
 * set, and each link's tp and peer. Yields TUTTI_OK, or the error (tp NULL). */
#define TT_KIT_CTX_NEW(tp, host)                                                                   \
    ({                                                                                             \
        int st_;                                                                                   \
        void *links_ = NULL;                                                                       \
        (tp) = tp_ctx_alloc((host), sizeof(*(tp)), sizeof(*(tp)->links), &links_, &st_);           \
        if (tp) {                                                                                  \
            (tp)->host = (host);                                                                   \
            (tp)->rank = (host)->rank;                                                             \
            (tp)->nranks = (host)->nranks;                                                         \
            (tp)->links = links_;                                                                  \
            for (int i_ = 0; i_ < (tp)->nranks; i_++) {                                            \
                (tp)->links[i_].tp = (tp);                                                         \
                (tp)->links[i_].peer = i_;                                                         \
            }                                                                                      \
        }                                                                                          \
        st_;                                                                                       \
    })

/* The context and its links, once what they hold is released. */
#define TT_KIT_CTX_FREE(tp)                                                                        \
    do {                                                                                           \
        free((tp)->links);                                                                         \
        free(tp);                                                                                  \
    } while (0)

#endif
