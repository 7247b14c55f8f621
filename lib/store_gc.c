/* Store garbage collection through the public operations. Interim: the backends do not
 * yet list keys, so a prefix cannot be deleted, and compare-and-delete is a read then a
 * delete (a record replaced in between would be lost). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "store_gc.h"

int tt_store_delete_prefix(tutti_store_t *store, const char *prefix)
{
    TT_UNUSED(store);
    TT_UNUSED(prefix);
    return TUTTI_ERR_UNSUPPORTED;
}

int tt_store_compare_delete(tutti_store_t *store, const char *key, const void *expected,
                            size_t elen)
{
    const char *k = key;
    int exists = 0;
    int st = tutti_store_check(store, &k, 1, &exists);
    if (st < 0 || !exists)
        return st;
    void *v = NULL;
    size_t len = 0;
    st = tutti_store_get(store, key, &v, &len, 0);
    if (st == 0 && len == elen && !memcmp(v, expected, elen))
        st = tutti_store_delete(store, key, NULL);
    free(v);
    return st;
}
