/* Store garbage collection (internal): what a communicator's last rank uses to leave no
 * keys behind. */
#ifndef TT_STORE_GC_H
#define TT_STORE_GC_H

#include <stddef.h>

#include <tutti/store.h>

/* Delete every key that starts with prefix (after the view's own prefix); an empty
 * full prefix is refused. TUTTI_ERR_UNSUPPORTED for a backend without it. (store.c) */
int tt_store_delete_prefix(tutti_store_t *store, const char *prefix);

/* Delete key only if its value is expected (elen bytes), atomically. (store.c) */
int tt_store_compare_delete(tutti_store_t *store, const char *key, const void *expected,
                            size_t elen);

#endif
