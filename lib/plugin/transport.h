/* Transport registry: built-in tables and plugins loaded from shared objects. Every
 * transport is seen through the ABI v2 table; a v1 plugin is wrapped by a shim. */
#ifndef TT_TRANSPORT_H
#define TT_TRANSPORT_H

#include <tutti/transport_v2.h>

typedef struct tt_builtin_transport {
    const char *name;
    const tutti_transport_ops_v2_t *(*get)(void);
} tt_builtin_transport_t;

extern const tt_builtin_transport_t tt_builtin_transports[];

/* Find transport `name`: built in, else libtutti-transport-NAME.so in plugin_path
 * (':'-separated), then in the install dir, then the loader's default search. A table
 * with the wrong size or ABI version is refused; err says why. *handle_p is the
 * dlopen handle (NULL for built-ins), for tt_transport_unload. */
int tt_transport_load(const char *name, const char *plugin_path,
                      const tutti_transport_ops_v2_t **ops_p, void **handle_p, char *err,
                      size_t errlen);
/* Load a plugin from an explicit file path: its tutti_transport_v2() table, else its
 * tutti_transport_v1() table behind the v1 shim. */
int tt_transport_load_file(const char *path, const tutti_transport_ops_v2_t **ops_p,
                           void **handle_p, char *err, size_t errlen);
void tt_transport_unload(void *handle);

/* The properties of built-in transport `name`, or NULL when none is built in. */
const tutti_tp_props_v2_t *tt_transport_builtin_props(const char *name);

/* The v1 shim (transport_v1shim.c): a v2 table that runs v1 table `v1` (loaded with
 * dlopen handle `handle`); NULL when all shim slots are taken (err says so). Released
 * by tt_transport_v1_release(handle). */
const tutti_transport_ops_v2_t *tt_transport_v1_wrap(const tutti_transport_ops_v1_t *v1,
                                                     void *handle, char *err, size_t errlen);
void tt_transport_v1_release(void *handle);

#endif /* TT_TRANSPORT_H */
