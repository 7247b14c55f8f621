/* Transport registry: the built-in tables, and plugins found as
 * libtutti-transport-NAME.so, checked for size and ABI version before use (ABI v2
 * tables as they are, v1 tables through the shim in transport_v1shim.c). */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "plugin/transport.h"

/* What both table versions must have; NULL when all is there, else what is wrong. */
#define TT_OPS_COMPLETE(o)                                                                         \
    ((o)->name && (o)->create && (o)->destroy && (o)->post_send && (o)->post_recv &&               \
     (o)->progress && (o)->cancel_all && (o)->notify_error && (o)->abort)

static int refuse(const char *what, char *err, size_t errlen, unsigned version, size_t size,
                  size_t need, int complete)
{
    if (version != TUTTI_TRANSPORT_ABI_V2 && version != TUTTI_TRANSPORT_ABI_V1)
        snprintf(err, errlen,
                 "transport %s: plugin ABI version %u, but this library speaks version %u "
                 "(and %u); rebuild the plugin against this tutti",
                 what, version, TUTTI_TRANSPORT_ABI_V2, TUTTI_TRANSPORT_ABI_V1);
    else if (size < need)
        snprintf(err, errlen, "transport %s: ops table is %zu bytes, ABI v%u needs %zu", what, size,
                 version, need);
    else if (!complete)
        snprintf(err, errlen, "transport %s: ops table lacks a required function", what);
    else
        return TUTTI_OK;
    return TUTTI_ERR_PLUGIN;
}

static int check_table(const tutti_transport_ops_v2_t *ops, const char *what, char *err,
                       size_t errlen)
{
    if (!ops) {
        snprintf(err, errlen, "transport %s: entry point returned no table", what);
        return TUTTI_ERR_PLUGIN;
    }
    /* a v2 table must say v2; register_mem/deregister_mem are optional, so the table
     * may end before them */
    unsigned v = ops->abi_version == TUTTI_TRANSPORT_ABI_V1 ? 0 : ops->abi_version;
    TT_CHECK(refuse(what, err, errlen, v, ops->size,
                    offsetof(tutti_transport_ops_v2_t, register_mem), TT_OPS_COMPLETE(ops)));
    if (!(ops->props.mem_kinds & TUTTI_MEM_BIT(TUTTI_MEM_HOST))) {
        snprintf(err, errlen, "transport %s: does not take host memory", what);
        return TUTTI_ERR_PLUGIN;
    }
    return TUTTI_OK;
}

/* A v1 table: checked as v1 always was, then wrapped by the shim. */
static const tutti_transport_ops_v2_t *load_v1(const tutti_transport_ops_v1_t *v1, void *handle,
                                               const char *what, char *err, size_t errlen)
{
    if (!v1) {
        snprintf(err, errlen, "transport %s: entry point returned no table", what);
        return NULL;
    }
    unsigned v = v1->abi_version == TUTTI_TRANSPORT_ABI_V2 ? 0 : v1->abi_version;
    if (refuse(what, err, errlen, v, v1->size, sizeof(*v1), TT_OPS_COMPLETE(v1)) < 0)
        return NULL;
    return tt_transport_v1_wrap(v1, handle, err, errlen);
}

int tt_transport_load_file(const char *path, const tutti_transport_ops_v2_t **ops_p,
                           void **handle_p, char *err, size_t errlen)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(err, errlen, "cannot load transport plugin %s: %s", path, dlerror());
        return TUTTI_ERR_PLUGIN;
    }
    /* the newest ABI first, as NCCL does with its net_vN tables */
    tutti_transport_entry_v2_fn entry2;
    tutti_transport_entry_v1_fn entry1;
    *(void **)&entry2 = dlsym(h, TUTTI_TRANSPORT_SYMBOL_V2);
    *(void **)&entry1 = entry2 ? NULL : dlsym(h, TUTTI_TRANSPORT_SYMBOL_V1);
    if (!entry2 && !entry1) {
        snprintf(err, errlen,
                 "transport plugin %s exports neither %s() nor %s(): not a tutti transport, "
                 "or built for another ABI version",
                 path, TUTTI_TRANSPORT_SYMBOL_V2, TUTTI_TRANSPORT_SYMBOL_V1);
        dlclose(h);
        return TUTTI_ERR_PLUGIN;
    }
    const tutti_transport_ops_v2_t *ops;
    int st = TUTTI_ERR_PLUGIN;
    if (entry2) {
        ops = entry2();
        st = check_table(ops, path, err, errlen);
    } else {
        ops = load_v1(entry1(), h, path, err, errlen);
        st = ops ? TUTTI_OK : TUTTI_ERR_PLUGIN;
    }
    if (st < 0) {
        dlclose(h);
        return st;
    }
    TT_INFO("loaded transport %s from %s (ABI v%u)", ops->name, path, entry2 ? 2u : 1u);
    *ops_p = ops;
    *handle_p = h;
    return TUTTI_OK;
}

const tutti_tp_props_v2_t *tt_transport_builtin_props(const char *name)
{
    for (const tt_builtin_transport_t *b = tt_builtin_transports; b->name; b++)
        if (!strcmp(b->name, name))
            return &b->get()->props;
    return NULL;
}

int tt_transport_load(const char *name, const char *plugin_path,
                      const tutti_transport_ops_v2_t **ops_p, void **handle_p, char *err,
                      size_t errlen)
{
    if (!name || !*name)
        name = "tcp";
    if (strchr(name, '/'))
        return tt_transport_load_file(name, ops_p, handle_p, err, errlen);
    for (const tt_builtin_transport_t *b = tt_builtin_transports; b->name; b++) {
        if (strcmp(b->name, name))
            continue;
        const tutti_transport_ops_v2_t *ops = b->get();
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
    if (handle) {
        tt_transport_v1_release(handle);
        dlclose(handle);
    }
}
