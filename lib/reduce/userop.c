/* Ops the caller defines (tutti_redop_create): a table of TUTTI_REDOP_USER_LAST -
 * TUTTI_REDOP_USER_FIRST + 1 slots, one per value, the reduce entry points' way to the
 * caller's function. A slot is `live` from create to free; every call that uses it holds
 * it (`refs`, from the call's issue to its completion: lib/coll/coll.c, lib/core/exec.c),
 * so a call still queued or running when its op is freed keeps the function it was
 * issued with, and the value is made again only once no call holds it. A slot's fields
 * are written before `live` (release) and read after it or `refs` (acquire). */
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
    _Atomic int refs;
} tt_userops[TT_USEROPS];
static pthread_mutex_t tt_userops_lock = PTHREAD_MUTEX_INITIALIZER;

/* The slot of a value in the user range, or -1 */
static int tt_userop_slot(tutti_redop_t op)
{
    unsigned i = (unsigned)op - TUTTI_REDOP_USER_FIRST;
    return (unsigned)op >= TUTTI_REDOP_USER_FIRST && i < TT_USEROPS ? (int)i : -1;
}

const tt_userop_t *tt_userop(tutti_redop_t op)
{
    int i = tt_userop_slot(op);
    if (i < 0 || (!atomic_load_explicit(&tt_userops[i].live, memory_order_acquire) &&
                  !atomic_load_explicit(&tt_userops[i].refs, memory_order_acquire)))
        return NULL;
    return &tt_userops[i].op;
}

int tt_redop_valid(tutti_redop_t op)
{
    int i = tt_userop_slot(op);
    return (unsigned)op < TUTTI_REDOP_COUNT ||
           (i >= 0 && atomic_load_explicit(&tt_userops[i].live, memory_order_acquire));
}

int tt_userop_hold(tutti_redop_t op)
{
    int i = tt_userop_slot(op);
    if (i < 0)
        return (unsigned)op < TUTTI_REDOP_COUNT ? 0 : -1;
    atomic_fetch_add_explicit(&tt_userops[i].refs, 1, memory_order_acq_rel);
    if (!atomic_load_explicit(&tt_userops[i].live, memory_order_acquire)) {
        atomic_fetch_sub_explicit(&tt_userops[i].refs, 1, memory_order_acq_rel);
        return -1;
    }
    return 1;
}

void tt_userop_release(tutti_redop_t op)
{
    int i = tt_userop_slot(op);
    if (i >= 0)
        atomic_fetch_sub_explicit(&tt_userops[i].refs, 1, memory_order_acq_rel);
}

/* "user128" ... "user255": a value's name when it is not defined now */
static char tt_user_names[TT_USEROPS][8];
static pthread_once_t tt_user_names_once = PTHREAD_ONCE_INIT;

static void tt_user_names_init(void)
{
    for (int i = 0; i < TT_USEROPS; i++)
        snprintf(tt_user_names[i], sizeof(tt_user_names[i]), "user%d", TUTTI_REDOP_USER_FIRST + i);
}

const char *tt_userop_name(tutti_redop_t op)
{
    int i = tt_userop_slot(op);
    if (i < 0)
        return NULL;
    const tt_userop_t *u = tt_userop(op);
    if (u)
        return u->name;
    pthread_once(&tt_user_names_once, tt_user_names_init);
    return tt_user_names[i];
}

const char *tt_redop_invalid_hint(tutti_redop_t op)
{
    return tt_userop_slot(op) >= 0 ? " (not defined, or freed: tutti_redop_create)" : "";
}

int tt_redop_commutes(tutti_redop_t op)
{
    const tt_userop_t *u = tt_userop(op);
    return !u || (u->flags & TUTTI_REDOP_COMMUTATIVE);
}

TT_EXPORT int tutti_redop_commutative(tutti_redop_t op, int *commute_p)
{
    if (!commute_p || !tt_redop_valid(op)) /* (as tutti_redop_free's: the status says it) */
        return TUTTI_ERR_INVALID_ARG;
    *commute_p = tt_redop_commutes(op);
    return TUTTI_OK;
}

TT_EXPORT int tutti_redop_create(tutti_redop_t *op_p, tutti_redop_fn fn, void *ctx, unsigned flags,
                                 const char *name)
{
    if (!op_p || !fn || (flags & ~(unsigned)TUTTI_REDOP_COMMUTATIVE))
        return TUTTI_ERR_INVALID_ARG;
    int st = TUTTI_ERR_NOMEM;
    pthread_mutex_lock(&tt_userops_lock);
    for (int i = 0; i < TT_USEROPS; i++) {
        /* free, and no call issued with its last op still holds it */
        if (atomic_load_explicit(&tt_userops[i].live, memory_order_relaxed) ||
            atomic_load_explicit(&tt_userops[i].refs, memory_order_acquire))
            continue;
        tt_userop_t *u = &tt_userops[i].op;
        u->fn = fn;
        u->ctx = ctx;
        u->flags = flags;
        if (name && *name) {
            snprintf(u->name, sizeof(u->name), "%s", name);
            /* cut on a character boundary: no UTF-8 sequence left half */
            size_t len = strlen(u->name);
            if (len == sizeof(u->name) - 1 && strlen(name) > len) {
                while (len > 0 && ((unsigned char)name[len] & 0xc0) == 0x80)
                    len--; /* name[len], the first byte dropped, continues a character */
                u->name[len] = '\0';
            }
        } else
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
    const int i = tt_userop_slot(op);
    int st = TUTTI_ERR_INVALID_ARG;
    pthread_mutex_lock(&tt_userops_lock);
    if (i >= 0 && atomic_load_explicit(&tt_userops[i].live, memory_order_relaxed)) {
        atomic_store_explicit(&tt_userops[i].live, 0, memory_order_release);
        st = TUTTI_OK;
    }
    pthread_mutex_unlock(&tt_userops_lock);
    return st;
}
