/* Ops the caller defines (tutti_redop_create): a table of TUTTI_REDOP_USER_LAST -
 * TUTTI_REDOP_USER_FIRST + 1 slots, one per value, the reduce entry points' way to the
 * caller's function. A slot's fields are written before `live` (release) and read after
 * it (acquire), so a collective running on another thread sees the whole op; freeing
 * one that a running call uses is the caller's error (tutti.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <tutti/tutti.h>

#include "base/base.h"
#include "reduce/reduce.h"

#define TT_EXPORT __attribute__((visibility("default")))
#define TT_USEROPS (TUTTI_REDOP_USER_LAST - TUTTI_REDOP_USER_FIRST + 1)

static struct {
    tt_userop_t op;
    _Atomic int live;
} tt_userops[TT_USEROPS];
static pthread_mutex_t tt_userops_lock = PTHREAD_MUTEX_INITIALIZER;

const tt_userop_t *tt_userop(tutti_redop_t op)
{
    unsigned i = (unsigned)op - TUTTI_REDOP_USER_FIRST;
    if ((unsigned)op < TUTTI_REDOP_USER_FIRST || i >= TT_USEROPS ||
        !atomic_load_explicit(&tt_userops[i].live, memory_order_acquire))
        return NULL;
    return &tt_userops[i].op;
}

int tt_redop_valid(tutti_redop_t op)
{
    return (unsigned)op < TUTTI_REDOP_COUNT || tt_userop(op);
}

const char *tt_redop_invalid_hint(tutti_redop_t op)
{
    return (unsigned)op >= TUTTI_REDOP_USER_FIRST && (unsigned)op <= TUTTI_REDOP_USER_LAST
               ? " (not defined, or freed: tutti_redop_create)"
               : "";
}

int tt_redop_commutes(tutti_redop_t op)
{
    const tt_userop_t *u = tt_userop(op);
    return !u || (u->flags & TUTTI_REDOP_COMMUTATIVE);
}

TT_EXPORT int tutti_redop_create(tutti_redop_t *op_p, tutti_redop_fn fn, void *ctx, unsigned flags,
                                 const char *name)
{
    if (!op_p || !fn || (flags & ~(unsigned)TUTTI_REDOP_COMMUTATIVE))
        return TUTTI_ERR_INVALID_ARG;
    int st = TUTTI_ERR_NOMEM;
    pthread_mutex_lock(&tt_userops_lock);
    for (int i = 0; i < TT_USEROPS; i++) {
        if (atomic_load_explicit(&tt_userops[i].live, memory_order_relaxed))
            continue;
        tt_userop_t *u = &tt_userops[i].op;
        u->fn = fn;
        u->ctx = ctx;
        u->flags = flags;
        if (name && *name)
            snprintf(u->name, sizeof(u->name), "%s", name);
        else
            snprintf(u->name, sizeof(u->name), "user%d", TUTTI_REDOP_USER_FIRST + i);
        atomic_store_explicit(&tt_userops[i].live, 1, memory_order_release);
        *op_p = (tutti_redop_t)(TUTTI_REDOP_USER_FIRST + i);
        st = TUTTI_OK;
        break;
    }
    pthread_mutex_unlock(&tt_userops_lock);
    return st;
}

TT_EXPORT int tutti_redop_free(tutti_redop_t op)
{
    int st = TUTTI_ERR_INVALID_ARG;
    pthread_mutex_lock(&tt_userops_lock);
    if (tt_userop(op)) {
        atomic_store_explicit(&tt_userops[(unsigned)op - TUTTI_REDOP_USER_FIRST].live, 0,
                              memory_order_release);
        st = TUTTI_OK;
    }
    pthread_mutex_unlock(&tt_userops_lock);
    return st;
}
