/* Transport registry: built-in tables and plugins loaded from shared objects. */
#ifndef TT_TRANSPORT_H
#define TT_TRANSPORT_H

#include <tutti/transport_v1.h>

typedef struct tt_builtin_transport {
    const char *name;
    const tutti_transport_ops_v1_t *(*get)(void);
} tt_builtin_transport_t;

extern const tt_builtin_transport_t tt_builtin_transports[];

/* Find transport `name`: built in, else libtutti-transport-NAME.so in plugin_path
 * (':'-separated), then in the install dir, then the loader's default search. A table
 * with the wrong size or ABI version is refused; err says why. *handle_p is the
 * dlopen handle (NULL for built-ins), for tt_transport_unload. */
int tt_transport_load(const char *name, const char *plugin_path,
                      const tutti_transport_ops_v1_t **ops_p, void **handle_p, char *err,
                      size_t errlen);
/* Load a plugin from an explicit file path. */
int tt_transport_load_file(const char *path, const tutti_transport_ops_v1_t **ops_p,
                           void **handle_p, char *err, size_t errlen);
void tt_transport_unload(void *handle);

#endif /* TT_TRANSPORT_H */
