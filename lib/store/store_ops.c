/* Caller's store ("ops://label"): the backend table forwarding each operation to the
 * callbacks of a tutti_store_ops_t (tutti_store_open_ops), with the deadline turned into
 * the milliseconds left, the callback's status checked, its error text passed on, and
 * the values it hands back given the NUL byte every backend's values have. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_impl.h"

typedef struct ops_store {
    tt_store_ops_t table; /* this handle's backend table: optional parts as the caller's */
    tutti_store_ops_t cb; /* the caller's callbacks, zero-extended to this library's size */
    void *ctx;
} ops_store_t;

static ops_store_t *ops_of(tutti_store_t *s)
{
    return s->impl;
}

/* The milliseconds left until deadline, rounded up (0: past; -1: none). */
static int ms_left(uint64_t deadline)
{
    return deadline == UINT64_MAX ? -1 : tt_ms_left(deadline);
}

enum { CB_SET, CB_GET, CB_ADD, CB_CAS, CB_CHECK, CB_DEL, CB_WAIT, CB_DEL_PREFIX, CB_CAD, CB_COUNT };
static const char *const cb_names[] = { "set",         "get",           "add",
                                        "compare_set", "check",         "del",
                                        "wait",        "delete_prefix", "compare_delete",
                                        "count_prefix" };

/* One call's arguments, whichever callback it is for. */
typedef struct cb_args {
    const char *key;
    const char *const *keys;
    size_t n;
    const void *value; /* set's value, compare_set's and compare_delete's expected */
    size_t len;
    const void *desired;
    size_t dlen;
    int64_t delta;
    int64_t *result_p;
    int *flag_p; /* check's exists, the deletes' deleted */
    size_t *count_p;
    void **value_p; /* get's value, compare_set's current */
    size_t *len_p;
} cb_args_t;

/* Room the callback gets in err->msg, the rest kept for "<name> callback: ". */
#define CB_TEXT (sizeof(((tt_store_err_t *)0)->msg) - 64)

/* Call callback `which` of s with a's arguments, the time left and err's buffer; its
 * answer as a status, err "<name> callback: <its text>" on failure. */
static int cb_call(tutti_store_t *s, int which, const cb_args_t *a, uint64_t deadline,
                   tt_store_err_t *err)
{
    ops_store_t *o = ops_of(s);
    const tutti_store_ops_t *cb = &o->cb;
    void *c = o->ctx;
    int t = ms_left(deadline), st = TUTTI_ERR_INTERNAL;
    char *e = err->msg, text[sizeof(err->msg)];
    e[0] = '\0';
    switch (which) {
    case CB_SET: st = cb->set(c, a->key, a->value, a->len, t, e, CB_TEXT); break;
    case CB_GET: st = cb->get(c, a->key, a->value_p, a->len_p, t, e, CB_TEXT); break;
    case CB_ADD: st = cb->add(c, a->key, a->delta, a->result_p, t, e, CB_TEXT); break;
    case CB_CAS:
        st = cb->compare_set(c, a->key, a->value, a->len, a->desired, a->dlen, a->value_p, a->len_p,
                             t, e, CB_TEXT);
        break;
    case CB_CHECK: st = cb->check(c, a->keys, a->n, a->flag_p, t, e, CB_TEXT); break;
    case CB_DEL: st = cb->del(c, a->key, a->flag_p, t, e, CB_TEXT); break;
    case CB_WAIT: st = cb->wait(c, a->keys, a->n, t, e, CB_TEXT); break;
    case CB_DEL_PREFIX: st = cb->delete_prefix(c, a->key, a->count_p, t, e, CB_TEXT); break;
    case CB_COUNT: st = cb->count_prefix(c, a->key, a->count_p, t, e, CB_TEXT); break;
    case CB_CAD:
        st = cb->compare_delete(c, a->key, a->value, a->len, a->flag_p, t, e, CB_TEXT);
        break;
    }
    if (st > 0 || st <= TUTTI_STATUS_LAST_) {
        tt_store_err_set(err, "the %s callback returned %d, which is not a tutti status",
                         cb_names[which], st);
        return TUTTI_ERR_STORE;
    }
    if (st < 0) {
        snprintf(text, sizeof(text), "%s", e[0] ? e : "failed without saying why");
        tt_store_err_set(err, "%s callback: %s", cb_names[which], text);
    }
    return st;
}

/* A value handed back by a callback, with the NUL byte after it that values carry. */
static int own_value(const char *what, void **value_p, size_t len, tt_store_err_t *err)
{
    if (!*value_p && len) {
        tt_store_err_set(err, "the %s callback returned %zu bytes at NULL", what, len);
        return TUTTI_ERR_STORE;
    }
    char *v = realloc(*value_p, len + 1);
    if (!v) {
        free(*value_p);
        tt_store_err_set(err, "out of memory for a value of %zu bytes", len);
        return TUTTI_ERR_NOMEM;
    }
    v[len] = '\0';
    *value_p = v;
    return TUTTI_OK;
}

static int ops_set(tutti_store_t *s, const char *key, const void *value, size_t len,
                   uint64_t deadline, tt_store_err_t *err)
{
    return cb_call(s, CB_SET, &(cb_args_t){ .key = key, .value = value, .len = len }, deadline,
                   err);
}

/* get and compare_set: a value comes back (in *value_p, only on success). What the
 * callback left in its *value_p (NULL on entry) is ours whatever it returned: freed on
 * failure too (store.h). */
static int fetch_value(tutti_store_t *s, int which, cb_args_t *a, void **value_p, size_t *len_p,
                       uint64_t deadline, tt_store_err_t *err)
{
    void *v = NULL;
    size_t len = 0;
    a->value_p = &v;
    a->len_p = &len;
    int st = cb_call(s, which, a, deadline, err);
    if (st < 0) {
        free(v);
        return st;
    }
    TT_CHECK(own_value(cb_names[which], &v, len, err));
    *value_p = v;
    *len_p = len;
    return TUTTI_OK;
}

static int ops_get(tutti_store_t *s, const char *key, void **value_p, size_t *len_p,
                   uint64_t deadline, tt_store_err_t *err)
{
    return fetch_value(s, CB_GET, &(cb_args_t){ .key = key }, value_p, len_p, deadline, err);
}

static int ops_add(tutti_store_t *s, const char *key, int64_t delta, int64_t *result_p,
                   uint64_t deadline, tt_store_err_t *err)
{
    cb_args_t a = { .key = key, .delta = delta, .result_p = result_p };
    return cb_call(s, CB_ADD, &a, deadline, err);
}

static int ops_compare_set(tutti_store_t *s, const char *key, const void *expected, size_t elen,
                           const void *desired, size_t dlen, void **current_p, size_t *curlen_p,
                           uint64_t deadline, tt_store_err_t *err)
{
    cb_args_t a = { .key = key, .value = expected, .len = elen, .desired = desired, .dlen = dlen };
    return fetch_value(s, CB_CAS, &a, current_p, curlen_p, deadline, err);
}

static int ops_wait(tutti_store_t *s, const char *const *keys, size_t n, uint64_t deadline,
                    tt_store_err_t *err)
{
    return cb_call(s, CB_WAIT, &(cb_args_t){ .keys = keys, .n = n }, deadline, err);
}

static int ops_check(tutti_store_t *s, const char *const *keys, size_t n, int *exists_p,
                     uint64_t deadline, tt_store_err_t *err)
{
    int exists = 0;
    int st = cb_call(s, CB_CHECK, &(cb_args_t){ .keys = keys, .n = n, .flag_p = &exists }, deadline,
                     err);
    *exists_p = exists != 0;
    return st;
}

static int ops_del(tutti_store_t *s, const char *key, int *deleted_p, uint64_t deadline,
                   tt_store_err_t *err)
{
    return cb_call(s, CB_DEL, &(cb_args_t){ .key = key, .flag_p = deleted_p }, deadline, err);
}

static int ops_del_prefix(tutti_store_t *s, const char *prefix, size_t *count_p, uint64_t deadline,
                          tt_store_err_t *err)
{
    cb_args_t a = { .key = prefix, .count_p = count_p };
    return cb_call(s, CB_DEL_PREFIX, &a, deadline, err);
}

static int ops_count_prefix(tutti_store_t *s, const char *prefix, size_t *count_p,
                            uint64_t deadline, tt_store_err_t *err)
{
    cb_args_t a = { .key = prefix, .count_p = count_p };
    return cb_call(s, CB_COUNT, &a, deadline, err);
}

static int ops_compare_del(tutti_store_t *s, const char *key, const void *expected, size_t elen,
                           int *deleted_p, uint64_t deadline, tt_store_err_t *err)
{
    cb_args_t a = { .key = key, .value = expected, .len = elen, .flag_p = deleted_p };
    return cb_call(s, CB_CAD, &a, deadline, err);
}

static void ops_close(tutti_store_t *s)
{
    ops_store_t *o = ops_of(s);
    if (o->cb.close)
        o->cb.close(o->ctx);
    free(o);
}

/* The first required callback ops lacks (NULL: none). */
static const char *missing_callback(const tutti_store_ops_t *cb)
{
    return !cb->set           ? "set"
           : !cb->get         ? "get"
           : !cb->add         ? "add"
           : !cb->compare_set ? "compare_set"
           : !cb->check       ? "check"
           : !cb->del         ? "del"
                              : NULL;
}

int tt_store_ops_open(tutti_store_t **store_p, const tutti_store_ops_t *ops, void *ctx,
                      const char *url, tt_store_err_t *err)
{
    size_t need = offsetof(tutti_store_ops_t, del) + sizeof(ops->del);
    if (ops->size < need) {
        tt_store_err_set(err,
                         "ops->size is %zu, less than the %zu bytes up to the last "
                         "required callback (del): set it to sizeof(tutti_store_ops_t)",
                         ops->size, need);
        return TUTTI_ERR_INVALID_ARG;
    }
    ops_store_t *o = calloc(1, sizeof(*o));
    if (!o) {
        tt_store_err_set(err, "out of memory");
        return TUTTI_ERR_NOMEM;
    }
    memcpy(&o->cb, ops, TT_MIN(ops->size, sizeof(o->cb)));
    const char *missing = missing_callback(&o->cb);
    if (missing) {
        tt_store_err_set(err, "the required callback %s is NULL", missing);
        free(o);
        return TUTTI_ERR_INVALID_ARG;
    }
    o->ctx = ctx;
    o->table = (tt_store_ops_t){
        .name = "ops",
        .set = ops_set,
        .get = ops_get,
        .add = ops_add,
        .compare_set = ops_compare_set,
        .wait = o->cb.wait ? ops_wait : NULL,
        .check = ops_check,
        .del = ops_del,
        .del_prefix = o->cb.delete_prefix ? ops_del_prefix : NULL,
        .compare_del = o->cb.compare_delete ? ops_compare_del : NULL,
        .count_prefix = o->cb.count_prefix ? ops_count_prefix : NULL,
        .close = ops_close,
    };
    tutti_store_t *s = tt_store_alloc(&o->table, url, -1, tt_store_open_timeout_ms(0));
    if (!s) {
        free(o);
        tt_store_err_set(err, "out of memory");
        return TUTTI_ERR_NOMEM;
    }
    s->impl = o;
    *store_p = s;
    return TUTTI_OK;
}
