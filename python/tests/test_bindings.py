"""The ctypes mirrors of tutti's option structs match the C headers field for field: the
C init functions write sizeof(the C struct) bytes into them, so a field added in C and
not here would be a buffer overrun, not an error."""
import ctypes
import os
import re

import pytest

from tutti import _lib, fuse

INCLUDE = os.path.join(os.path.dirname(__file__), "..", "..", "include", "tutti")
C_TYPES = {"size_t": ctypes.sizeof(ctypes.c_size_t), "int": ctypes.sizeof(ctypes.c_int),
           "tutti_redop_t": ctypes.sizeof(ctypes.c_int)}


def c_fields(header, struct):
    """(name, size) of each field of `typedef struct <struct> {...}` in header."""
    text = open(os.path.join(INCLUDE, header)).read()
    body = re.search(r"typedef struct %s \{(.*?)\} %s_t;" % (struct, struct), text, re.S)
    assert body, f"{struct} not found in {header}"
    code = re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S)
    fields = []
    for decl in filter(None, (d.strip() for d in code.split(";"))):
        m = re.fullmatch(r"(.*?)(\**)\s*(\w+)", " ".join(decl.split()))
        assert m, f"cannot read the field {decl!r} of {struct}"
        ctype, ptr, name = m.group(1).strip(), m.group(2), m.group(3)
        size = ctypes.sizeof(ctypes.c_void_p) if ptr or "*" in ctype else C_TYPES[ctype]
        fields.append((name, size))
    return fields


@pytest.mark.parametrize("mirror,header,struct", [
    (_lib.CommOpts, "tutti.h", "tutti_comm_opts"),
    (_lib.StoreOpts, "store.h", "tutti_store_opts"),
    (fuse.FuseOpts, "fuse.h", "tutti_fuse_opts"),
])
def test_option_structs_match_the_headers(mirror, header, struct):
    want = c_fields(header, struct)
    got = [(name, ctypes.sizeof(t)) for name, t in mirror._fields_]
    assert got == want


@pytest.mark.parametrize("mirror,init", [
    (_lib.CommOpts, "tutti_comm_opts_init"),
    (_lib.StoreOpts, "tutti_store_opts_init"),
    (fuse.FuseOpts, "tutti_fuse_opts_init"),
])
def test_init_writes_the_size_the_mirror_has(mirror, init):
    # room for a C struct larger than the mirror: a mismatch fails here, not in memory
    buf = ctypes.create_string_buffer(ctypes.sizeof(mirror) + 256)
    assert getattr(_lib.lib, init)(ctypes.cast(buf, ctypes.POINTER(mirror))) == 0
    assert ctypes.cast(buf, ctypes.POINTER(mirror)).contents.size == ctypes.sizeof(mirror)


def test_algorithms_are_the_ones_in_algos_def():
    """tutti.algorithms(coll) lists what lib/coll/algos.def has for coll, in its order
    (the file read here, not the library's table)."""
    import tutti
    src = open(os.path.join(INCLUDE, "..", "..", "lib", "coll", "algos.def")).read()
    rows = re.findall(r'^TT_ALGO_X\("(\w+)", TT_COLL_(\w+), (\d+),', src, re.M)
    assert len(rows) >= 21
    for coll in ("allreduce", "broadcast", "barrier", "reduce", "allgather",
                 "reduce_scatter", "gather", "scatter", "alltoall"):
        want = [name for name, c, _ in sorted(rows, key=lambda r: int(r[2]))
                if c == coll.upper()]
        assert want, coll
        assert tutti.algorithms(coll) == want, coll
    with pytest.raises(ValueError):
        tutti.algorithms("reduce-scatter")


def test_exit_without_destroy_closes_cleanly(tmp_path):
    """A program that leaves its communicator and store open exits with 0 and says
    nothing: the module closes them at exit (and registers nothing else there)."""
    import subprocess
    import sys
    code = ("import tutti\n"
            "s = tutti.Store('file://%s')\n"
            "c = tutti.Communicator(s, 0, 1)\n"
            "c.allreduce(bytearray(8))\n"
            "print('ran', c.size)\n" % tmp_path)
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "ran 1\n"
    assert "Error" not in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_version_is_the_librarys_and_meson_builds():
    import tutti
    meson = open(os.path.join(INCLUDE, "..", "..", "meson.build")).read()
    want = re.search(r"version\s*:\s*'([0-9.]+)'", meson).group(1)
    assert tutti.__version__ == tutti.version == want
    assert _lib.lib.tutti_version() == sum(int(x) * m for x, m in
                                           zip(want.split("."), (10000, 100, 1)))


def test_a_library_of_another_version_is_refused():
    """TUTTI_LIBRARY naming a library without tutti_version_string (here libc, as a
    libtutti from before it would be): import fails saying what to set, rather than
    reading the option structs of another layout."""
    import subprocess
    import sys
    env = dict(os.environ, TUTTI_LIBRARY="libc.so.6")
    r = subprocess.run([sys.executable, "-c", "import tutti"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert "is libtutti built before tutti_version_string" in r.stderr, r.stderr
    assert "set TUTTI_LIBRARY to the libtutti built with this package" in r.stderr, r.stderr
