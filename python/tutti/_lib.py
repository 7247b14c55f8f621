"""libtutti through ctypes: finding the library, the option structs, the prototypes.

ctypes.CDLL releases the GIL around every foreign call, so a blocking collective lets
other Python threads run.
"""
import ctypes
import ctypes.util
import operator
import os

from . import _paths

c_size_p = ctypes.POINTER(ctypes.c_size_t)
c_void_pp = ctypes.POINTER(ctypes.c_void_p)

# The sentinels of <tutti/tutti.h>.
IN_PLACE = ctypes.c_void_p(1)
IN_PLACE_OUT = ctypes.c_void_p(1)
ANY_SOURCE = -2  # TUTTI_ANY_SOURCE: recv's peer for "whichever rank sends this tag"
UNIQUE_ID_BYTES = 128  # TUTTI_UNIQUE_ID_BYTES
PROC_NULL = -3  # TUTTI_PROC_NULL: a peer that is no rank (MPI_PROC_NULL)
ANY_TAG = 0xFFFFFFFF  # TUTTI_ANY_TAG: a receive's or probe's tag for "whichever tag" (MPI_ANY_TAG)


def _candidates():
    env = os.environ.get("TUTTI_LIBRARY")
    if env:
        return [env]
    found = ctypes.util.find_library("tutti")
    return [p for p in (_paths.LIBRARY, found, "libtutti.so.0") if p]


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError("tutti: cannot load libtutti (set TUTTI_LIBRARY to its path): "
                      + "; ".join(errors))


lib = _load()


def _check_version():
    """The structs below are the headers' of this package's version: a libtutti of another
    version (an older install found first, a TUTTI_LIBRARY left over) is refused here
    rather than misread field by field."""
    f = getattr(lib, "tutti_version_string", None)
    have = None
    if f is not None:
        f.restype, f.argtypes = ctypes.c_char_p, []
        have = f().decode()
    why = None
    if have != _paths.VERSION:
        why = f"is libtutti {have or 'built before tutti_version_string'}"
    else:
        # a build of the same version with other option structs: the size field the C
        # init writes (into a buffer larger than any) must be the mirror's
        for init, mirror in (("tutti_comm_opts_init", CommOpts),
                             ("tutti_store_opts_init", StoreOpts)):
            buf = ctypes.create_string_buffer(65536)
            getattr(lib, init)(buf)
            size = ctypes.c_size_t.from_buffer(buf).value
            if size != ctypes.sizeof(mirror):
                why = (f"has a {size}-byte {init[:-5]}_t where this package's is "
                       f"{ctypes.sizeof(mirror)} bytes")
                break
    if why:
        raise ImportError(f"tutti: this package is version {_paths.VERSION}, but {lib._name} "
                          f"{why}: set TUTTI_LIBRARY to the libtutti built with this package")


class CommOpts(ctypes.Structure):
    """tutti_comm_opts_t, field for field (include/tutti/tutti.h)."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("timeout_ms", ctypes.c_int),
        ("transport", ctypes.c_char_p),
        ("plugin_path", ctypes.c_char_p),
        ("algo", ctypes.c_char_p),
        ("socket_ifname", ctypes.c_char_p),
        ("socket_family", ctypes.c_int),
        ("socket_buffer_bytes", ctypes.c_int),
        ("spin_us", ctypes.c_int),
        ("chunk_bytes", ctypes.c_size_t),
        ("prefix", ctypes.c_char_p),
        ("stall_check_ms", ctypes.c_int),
        ("host_id", ctypes.c_char_p),
        ("cost_model", ctypes.c_char_p),
        ("transport_options", ctypes.c_char_p),
        ("job_id", ctypes.c_char_p),
        ("auth_token", ctypes.c_char_p),
        ("auth_token_file", ctypes.c_char_p),
        ("checksum", ctypes.c_char_p),
        ("job_settle_ms", ctypes.c_int),
        ("defer_us", ctypes.c_int),
        ("agree_lag", ctypes.c_int),
        ("bind", ctypes.c_char_p),
        ("trace_entries", ctypes.c_int),
        ("trace_dir", ctypes.c_char_p),
        ("cuda", ctypes.c_char_p),
        ("stream_timeout_ms", ctypes.c_int),
        ("tls_cert", ctypes.c_char_p),
        ("tls_key", ctypes.c_char_p),
        ("tls_ca_file", ctypes.c_char_p),
        ("tls_ca_path", ctypes.c_char_p),
    ]


class MsgInfo(ctypes.Structure):
    """tutti_msg_info_t (include/tutti/tutti.h): what a receive took or a probe found."""
    _fields_ = [("source", ctypes.c_int), ("tag", ctypes.c_uint32), ("count", ctypes.c_size_t),
                ("dtype", ctypes.c_int)]


class StoreOpts(ctypes.Structure):
    """tutti_store_opts_t, field for field (include/tutti/store.h)."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("timeout_ms", ctypes.c_int),
        ("is_server", ctypes.c_int),
        ("auth_token", ctypes.c_char_p),
        ("auth_token_file", ctypes.c_char_p),
        ("instance", ctypes.c_char_p),
        ("idle_timeout_ms", ctypes.c_int),
        ("max_connections", ctypes.c_int),
        ("client_quota_bytes", ctypes.c_size_t),
        ("memory_limit_bytes", ctypes.c_size_t),
        ("password", ctypes.c_char_p),
        ("fsync", ctypes.c_int),
    ]


INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
# the ranges of the option structs' integer field types (ctypes keeps the low bits)
_RANGES = {ctypes.c_int: (INT_MIN, INT_MAX), ctypes.c_size_t: (0, (1 << 64) - 1)}


def checked_int(v, what, lo=INT_MIN, hi=INT_MAX):
    """v as a Python int within [lo, hi] (a C int by default): ctypes would keep its low
    bits. InvalidArgError naming `what` otherwise; TypeError for a non-integer."""
    if type(v) is not int:
        try:
            v = operator.index(v)
        except TypeError:
            raise TypeError(f"tutti: {what} must be an integer, not {type(v).__name__}") \
                from None
    if not lo <= v <= hi:
        from ._errors import InvalidArgError  # here: _errors imports this module
        raise InvalidArgError(f"tutti: {what} {v} is out of range ({lo} to {hi})")
    return v


def _fill(struct, init, kwargs, what):
    """A struct from its C init function (defaults and the environment), then kwargs
    (None: the default; an integer outside its field's C type is refused)."""
    s = struct()
    init(ctypes.byref(s))
    keep = []
    names = {f[0]: f[1] for f in struct._fields_}
    for key, value in kwargs.items():
        if key not in names or key == "size":
            raise TypeError(f"tutti: unknown {what} option {key!r} "
                            f"(known: {', '.join(n for n in names if n != 'size')})")
        if value is None:
            continue
        ctype = names[key]
        if ctype is ctypes.c_char_p:
            value = str(value).encode()
            keep.append(value)
        elif ctype in _RANGES:
            value = checked_int(value, f"{what} option {key}", *_RANGES[ctype])
        setattr(s, key, value)
    return s, keep


def comm_opts(kwargs):
    return _fill(CommOpts, lib.tutti_comm_opts_init, kwargs, "communicator")


def store_opts(kwargs):
    return _fill(StoreOpts, lib.tutti_store_opts_init, kwargs, "store")


_I, _P, _S, _U32 = ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32
_WP = c_void_pp

# name: (restype, argtypes). Every collective's blocking form and its _async form (one
# more argument: the work handle out-pointer) come from one row.
_COLLECTIVES = {
    "allreduce": [_P, _P, _P, _S, _I, _I],
    "broadcast": [_P, _P, _P, _S, _I, _I],
    "barrier": [_P],
    "reduce": [_P, _P, _P, _S, _I, _I, _I],
    "allgather": [_P, _P, _P, _S, _I],
    "allgatherv": [_P, _P, _P, c_size_p, c_size_p, _I],
    "reduce_scatter": [_P, _P, _P, _S, _I, _I],
    "reduce_scatterv": [_P, _P, _P, c_size_p, _I, _I],
    "gather": [_P, _P, _P, _S, _I, _I],
    "gatherv": [_P, _P, _S, _P, c_size_p, c_size_p, _I, _I],
    "scatter": [_P, _P, _P, _S, _I, _I],
    "scatterv": [_P, _P, c_size_p, c_size_p, _P, _S, _I, _I],
    "alltoall": [_P, _P, _P, _S, _I],
    "alltoallv": [_P, _P, c_size_p, c_size_p, _P, c_size_p, c_size_p, _I],
    "scan": [_P, _P, _P, _S, _I, _I],
    "exscan": [_P, _P, _P, _S, _I, _I],
    "neighbor_allgather": [_P, _P, _P, _S, _I],
    "neighbor_allgatherv": [_P, _P, _S, _P, c_size_p, c_size_p, _I],
    "neighbor_alltoall": [_P, _P, _P, _S, _I],
    "neighbor_alltoallv": [_P, _P, c_size_p, c_size_p, _P, c_size_p, c_size_p, _I],
    "send": [_P, _P, _S, _I, _I, _U32],
    "recv": [_P, _P, _S, _I, _I, _U32],
}

# tutti_redop_fn: dst, a, b, count, dtype, ctx
REDOP_FN = ctypes.CFUNCTYPE(None, _P, _P, _P, _S, _I, _P)
# tutti_work_on_done's fn: arg, status
DONE_FN = ctypes.CFUNCTYPE(None, _P, _I)

_OTHERS = {
    "tutti_strerror": (ctypes.c_char_p, [_I]),
    "tutti_version_string": (ctypes.c_char_p, []),
    "tutti_status_name": (ctypes.c_char_p, [_I]),
    "tutti_dtype_size": (_S, [_I]),
    "tutti_dtype_name": (ctypes.c_char_p, [_I]),
    "tutti_redop_name": (ctypes.c_char_p, [_I]),
    "tutti_dtype_parse": (_I, [ctypes.c_char_p, ctypes.POINTER(_I)]),
    "tutti_redop_parse": (_I, [ctypes.c_char_p, ctypes.POINTER(_I)]),
    "tutti_redop_create": (_I, [ctypes.POINTER(_I), REDOP_FN, _P, ctypes.c_uint,
                                ctypes.c_char_p]),
    "tutti_redop_free": (_I, [_I]),
    "tutti_redop_commutative": (_I, [_I, ctypes.POINTER(_I)]),
    "tutti_type_resized": (_I, [_I, ctypes.c_ssize_t, _S, ctypes.POINTER(_I)]),
    "tutti_type_free": (_I, [_I]),
    "tutti_work_on_done": (_I, [_P, DONE_FN, _P]),
    "tutti_comm_opts_init": (_I, [ctypes.POINTER(CommOpts)]),
    "tutti_comm_init": (_I, [_WP, _P, _I, _I, ctypes.POINTER(CommOpts)]),
    "tutti_comm_init_env": (_I, [_WP, ctypes.POINTER(CommOpts)]),
    "tutti_comm_destroy": (_I, [_P]),
    "tutti_comm_abort": (_I, [_P]),
    "tutti_comm_revoke": (_I, [_P]),
    "tutti_comm_grow": (_I, [_P, _I, _WP]),
    "tutti_comm_shrink_live": (_I, [_P, _I, _WP]),
    "tutti_comm_agree": (_I, [_P, _I, ctypes.POINTER(_U32), ctypes.POINTER(_I),
                             ctypes.POINTER(_I)]),
    "tutti_comm_join": (_I, [_WP, _P, ctypes.POINTER(CommOpts)]),
    "tutti_get_unique_id": (_I, [ctypes.c_char_p]),
    "tutti_comm_init_rank": (_I, [_WP, _I, ctypes.c_char_p, _I, ctypes.POINTER(CommOpts)]),
    "tutti_unique_id_release": (_I, [ctypes.c_char_p]),
    "tutti_comm_init_all": (_I, [_P, _I, ctypes.POINTER(CommOpts)]),
    "tutti_comm_split": (_I, [_P, _I, _I, _WP]),
    "tutti_comm_split_type": (_I, [_P, _I, _I, _WP]),
    "tutti_comm_split_opts": (_I, [_P, _I, _I, ctypes.POINTER(CommOpts), _WP]),
    "tutti_comm_get_async_error": (_I, [_P, ctypes.c_char_p, _S]),
    "tutti_comm_dup": (_I, [_P, _WP]),
    "tutti_dist_graph_create_adjacent": (_I, [_P, _I, ctypes.POINTER(_I), _I, ctypes.POINTER(_I), _WP]),
    "tutti_cart_create": (_I, [_P, _I, ctypes.POINTER(_I), ctypes.POINTER(_I), _WP]),
    "tutti_dist_graph_create": (_I, [_P, _I, ctypes.POINTER(_I), ctypes.POINTER(_I),
                                     ctypes.POINTER(_I), _WP]),
    "tutti_cart_sub": (_I, [_P, ctypes.POINTER(_I), _WP]),
    "tutti_dims_create": (_I, [_I, _I, ctypes.POINTER(_I)]),
    "tutti_topo_test": (_I, [_P, ctypes.POINTER(_I)]),
    "tutti_cartdim_get": (_I, [_P, ctypes.POINTER(_I)]),
    "tutti_cart_get": (_I, [_P, _I, ctypes.POINTER(_I), ctypes.POINTER(_I), ctypes.POINTER(_I)]),
    "tutti_cart_rank": (_I, [_P, ctypes.POINTER(_I), ctypes.POINTER(_I)]),
    "tutti_cart_coords": (_I, [_P, _I, _I, ctypes.POINTER(_I)]),
    "tutti_cart_shift": (_I, [_P, _I, _I, ctypes.POINTER(_I), ctypes.POINTER(_I)]),
    "tutti_topo_neighbors_count": (_I, [_P, ctypes.POINTER(_I), ctypes.POINTER(_I)]),
    "tutti_topo_neighbors": (_I, [_P, _I, ctypes.POINTER(_I), _I, ctypes.POINTER(_I)]),
    "tutti_comm_shrink": (_I, [_P, _P, _I, _WP]),
    "tutti_comm_rank": (_I, [_P]),
    "tutti_comm_size": (_I, [_P]),
    "tutti_comm_last_error": (ctypes.c_char_p, [_P]),
    "tutti_comm_transport": (ctypes.c_char_p, [_P]),
    "tutti_comm_device": (ctypes.c_char_p, [_P]),
    "tutti_comm_timeout": (_I, [_P]),
    "tutti_probe": (_I, [_P, _I, _U32, ctypes.POINTER(_I), ctypes.POINTER(_S),
                         ctypes.POINTER(_I)]),
    "tutti_iprobe": (_I, [_P, _I, _U32, ctypes.POINTER(_I), ctypes.POINTER(_I),
                          ctypes.POINTER(_S), ctypes.POINTER(_I)]),
    "tutti_mprobe": (_I, [_P, _I, _U32, ctypes.POINTER(_P), ctypes.POINTER(_I),
                          ctypes.POINTER(_S), ctypes.POINTER(_I)]),
    "tutti_improbe": (_I, [_P, _I, _U32, ctypes.POINTER(_I), ctypes.POINTER(_P),
                           ctypes.POINTER(_I), ctypes.POINTER(_S), ctypes.POINTER(_I)]),
    "tutti_mrecv": (_I, [_P, _P, _S, _I]),
    "tutti_probe_info": (_I, [_P, _I, _U32, ctypes.POINTER(_I), ctypes.POINTER(MsgInfo)]),
    "tutti_message_info": (_I, [_P, ctypes.POINTER(MsgInfo)]),
    "tutti_work_info": (_I, [_P, ctypes.POINTER(MsgInfo)]),
    "tutti_message_free": (None, [_P]),
    "tutti_comm_set_timeout": (_I, [_P, _I]),
    "tutti_comm_set_stream": (_I, [_P, ctypes.c_void_p]),
    "tutti_comm_stream_error": (_I, [_P]),
    "tutti_comm_trace_dump": (_I, [_P, _I]),
    "tutti_comm_algo_for": (ctypes.c_char_p, [_P, ctypes.c_char_p, _S]),
    "tutti_algo_name": (ctypes.c_char_p, [ctypes.c_char_p, _I]),
    "tutti_test": (_I, [_P, ctypes.POINTER(_I)]),
    "tutti_wait": (_I, [_P, _I]),
    "tutti_wait_any": (_I, [_S, ctypes.POINTER(_P), _I, ctypes.POINTER(_I)]),
    "tutti_work_free": (None, [_P]),
    "tutti_cancel": (_I, [_P, ctypes.POINTER(_I)]),
    "tutti_work_error": (ctypes.c_char_p, [_P]),
    "tutti_work_source": (_I, [_P]),
    "tutti_work_count": (_S, [_P]),
    "tutti_reduce_local": (_I, [_P, _P, _S, _I, _I]),
    "tutti_recv_upto_async": (_I, [_P, _P, _S, _I, _I, _U32, _WP]),
    "tutti_store_opts_init": (_I, [ctypes.POINTER(StoreOpts)]),
    "tutti_store_open": (_I, [_WP, ctypes.c_char_p, ctypes.POINTER(StoreOpts)]),
    "tutti_store_open_prefixed": (_I, [_WP, _P, ctypes.c_char_p]),
    "tutti_store_open_env": (_I, [_WP, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                                  ctypes.POINTER(CommOpts)]),
    "tutti_store_close": (None, [_P]),
    "tutti_store_url": (ctypes.c_char_p, [_P]),
    "tutti_store_port": (_I, [_P]),
    "tutti_store_last_error": (ctypes.c_char_p, [_P]),
    "tutti_store_set": (_I, [_P, ctypes.c_char_p, ctypes.c_char_p, _S]),
    "tutti_store_get": (_I, [_P, ctypes.c_char_p, _WP, c_size_p, _I]),
    "tutti_store_add": (_I, [_P, ctypes.c_char_p, ctypes.c_int64,
                             ctypes.POINTER(ctypes.c_int64)]),
    "tutti_store_compare_set": (_I, [_P, ctypes.c_char_p, ctypes.c_char_p, _S,
                                     ctypes.c_char_p, _S, _WP, c_size_p]),
    "tutti_store_check": (_I, [_P, ctypes.POINTER(ctypes.c_char_p), _S, ctypes.POINTER(_I)]),
    "tutti_store_wait": (_I, [_P, ctypes.POINTER(ctypes.c_char_p), _S, _I]),
    "tutti_store_delete": (_I, [_P, ctypes.c_char_p, ctypes.POINTER(_I)]),
    "tutti_store_count": (_I, [_P, ctypes.c_char_p, ctypes.POINTER(_S)]),
}


def _declare():
    for name, args in _COLLECTIVES.items():
        for fn, argtypes in ((f"tutti_{name}", args), (f"tutti_{name}_async", args + [_WP])):
            f = getattr(lib, fn)
            f.restype, f.argtypes = _I, argtypes
    for fn, (restype, argtypes) in _OTHERS.items():
        f = getattr(lib, fn)
        f.restype, f.argtypes = restype, argtypes


_check_version()  # before _declare: a foreign library lacks its names
_declare()

libc = ctypes.CDLL(None)
libc.free.argtypes = [ctypes.c_void_p]
libc.free.restype = None
