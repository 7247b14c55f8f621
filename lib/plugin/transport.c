/* Transport registry: the built-in tables, and plugins found as
 * libtutti-transport-NAME.so, checked for size and ABI version before use. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "plugin/transport.h"

static int check_table(const tutti_transport_ops_v1_t *ops, const char *what, char *err,
                       size_t errlen)
{
    if (!ops) {
        snprintf(err, errlen, "transport %s: entry point returned no table", what);
        return TUTTI_ERR_PLUGIN;
    }
    if (ops->abi_version != TUTTI_TRANSPORT_ABI_V1) {
        snprintf(err, errlen,
                 "transport %s: plugin ABI version %u, but this library speaks version %u; "
                 "rebuild the plugin against this tutti",
                 what, ops->abi_version, TUTTI_TRANSPORT_ABI_V1);
        return TUTTI_ERR_PLUGIN;
    }
    if (ops->size < sizeof(tutti_transport_ops_v1_t)) {
        snprintf(err, errlen, "transport %s: ops table is %zu bytes, ABI v1 needs %zu", what,
                 ops->size, sizeof(tutti_transport_ops_v1_t));
        return TUTTI_ERR_PLUGIN;
    }
    if (!ops->name || !ops->create || !ops->destroy || !ops->post_send || !ops->post_recv ||
        !ops->progress || !ops->cancel_all || !ops->notify_error || !ops->abort) {
        snprintf(err, errlen, "transport %s: ops table lacks a required function", what);
        return TUTTI_ERR_PLUGIN;
    }
    return TUTTI_OK;
}

int tt_transport_load_file(const char *path, const tutti_transport_ops_v1_t **ops_p,
                           void **handle_p, char *err, size_t errlen)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(err, errlen, "cannot load transport plugin %s: %s", path, dlerror());
        return TUTTI_ERR_PLUGIN;
    }
    tutti_transport_entry_v1_fn entry;
    *(void **)&entry = dlsym(h, TUTTI_TRANSPORT_SYMBOL_V1);
    if (!entry) {
        snprintf(err, errlen,
                 "transport plugin %s exports no %s(): not a tutti transport, or built for "
                 "another ABI version",
                 path, TUTTI_TRANSPORT_SYMBOL_V1);
        dlclose(h);
        return TUTTI_ERR_PLUGIN;
    }
    const tutti_transport_ops_v1_t *ops = entry();
    int st = check_table(ops, path, err, errlen);
    if (st < 0) {
        dlclose(h);
        return st;
    }
    TT_INFO("loaded transport %s from %s", ops->name, path);
    *ops_p = ops;
    *handle_p = h;
    return TUTTI_OK;
}

int tt_transport_load(const char *name, const char *plugin_path,
                      const tutti_transport_ops_v1_t **ops_p, void **handle_p, char *err,
                      size_t errlen)
{
    if (!name || !*name)
        name = "tcp";
    if (strchr(name, '/'))
        return tt_transport_load_file(name, ops_p, handle_p, err, errlen);
    for (const tt_builtin_transport_t *b = tt_builtin_transports; b->name; b++) {
        if (strcmp(b->name, name))
            continue;
        const tutti_transport_ops_v1_t *ops = b->get();
        TT_CHECK(check_table(ops, name, err, errlen));
        *ops_p = ops;
        *handle_p = NULL;
        return TUTTI_OK;
    }
    for (const char *c = name; *c; c++) {
        if (!(*c == '_' || *c == '-' || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9'))) {
            snprintf(err, errlen, "transport name \"%s\" is not valid", name);
            return TUTTI_ERR_CONFIG;
        }
    }
    char file[256];
    snprintf(file, sizeof(file), "libtutti-transport-%s.so", name);
    char tried[1024] = "";
    char path[1024];
    int st = TUTTI_ERR_PLUGIN;
    char dirs[2048];
    snprintf(dirs, sizeof(dirs), "%s:%s/tutti", plugin_path ? plugin_path : "", TUTTI_LIBDIR);
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(path, sizeof(path), "%s/%s", d, file);
        FILE *f = fopen(path, "r");
        if (!f) {
            size_t n = strlen(tried);
            snprintf(tried + n, sizeof(tried) - n, "%s%s", n ? ", " : "", d);
            continue;
        }
        fclose(f);
        /* The file exists: its verdict is final (a refused plugin must not be
         * silently replaced by another one further down the path). */
        return tt_transport_load_file(path, ops_p, handle_p, err, errlen);
    }
    /* Last, the dynamic loader's own search (LD_LIBRARY_PATH ...). */
    st = tt_transport_load_file(file, ops_p, handle_p, err, errlen);
    if (st < 0) {
        char builtins[256] = "";
        for (const tt_builtin_transport_t *b = tt_builtin_transports; b->name; b++) {
            size_t n = strlen(builtins);
            snprintf(builtins + n, sizeof(builtins) - n, "%s%s", n ? ", " : "", b->name);
        }
        snprintf(err, errlen,
                 "unknown transport \"%s\": not built in (built in: %s) and no %s in "
                 "TUTTI_PLUGIN_PATH or %s/tutti (searched: %s) nor on the loader path",
                 name, builtins, file, TUTTI_LIBDIR, tried[0] ? tried : "none");
    }
    return st;
}

void tt_transport_unload(void *handle)
{
    if (handle)
        dlclose(handle);
}
