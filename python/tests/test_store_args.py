"""tutti.Store's arguments: keys and prefixes with a NUL are refused rather than cut short
at it by the C side, values are bytes-like or str (an int is not n zero bytes), and a
list of keys is not a str (whose characters would each be a key)."""
import pytest

import tutti


@pytest.fixture
def store(tmp_path):
    s = tutti.Store(f"file://{tmp_path}")
    yield s
    s.close()


def test_nul_in_keys_and_prefixes_is_refused(store):
    with pytest.raises(ValueError, match="NUL"):
        store.set("a\x00secret", b"v")
    assert not store.check(["a"])  # nothing was written under the cut-short key
    store.set("a", b"1")
    for call in (lambda: store.get("a\x00x", 100), lambda: store.add("a\x00x", 1),
                 lambda: store.compare_set("a\x00x", b"1", b"2"), lambda: store.delete("a\x00x"),
                 lambda: store.check(["a\x00x"]), lambda: store.wait(["a\x00x"], 100),
                 lambda: store.count("a\x00"), lambda: store.prefixed("p\x00")):
        with pytest.raises(ValueError, match="NUL"):
            call()
    assert store.get("a") == b"1"
    with pytest.raises(TypeError, match="str"):
        store.set(b"bytes-key", b"v")


def test_values_are_bytes_like_or_str(store):
    with pytest.raises(TypeError, match="bytes-like or a str, not int"):
        store.set("n", 5)
    assert not store.check(["n"])
    store.set("s", "é")  # str: UTF-8
    assert store.get("s") == "é".encode()
    store.set("b", bytearray(b"ab"))
    store.set("m", memoryview(b"xyz"))
    assert store.get("b") == b"ab" and store.get("m") == b"xyz"
    with pytest.raises(TypeError, match="not int"):
        store.compare_set("c", b"", 3)
    with pytest.raises(TypeError, match="expected value"):
        store.compare_set("c", 0, b"x")
    assert store.compare_set("c", "", "first") == b"first"
    assert store.compare_set("c", b"first", memoryview(b"second")) == b"second"


def test_a_str_is_not_a_list_of_keys(store):
    store.set("a", b"1")
    store.set("b", b"2")
    for call in (lambda: store.wait("ab", 300), lambda: store.check("ab"),
                 lambda: store.wait(b"ab", 300)):
        with pytest.raises(TypeError, match="list of keys"):
            call()
    store.wait(["a", "b"], 300)  # a list: each key
    assert store.check(["a", "b"]) and not store.check(["ab"])
    view = store.prefixed("p/")
    view.set("k", "v")
    assert store.get("p/k") == b"v" and view.count() == 1


def test_integer_options_a_field_cannot_hold_are_refused(tmp_path):
    """Store(url, timeout_ms=2**32 + 50) would be a 50 ms timeout through ctypes (the low
    bits): refused, as a negative size and the communicator's options are."""
    url = f"file://{tmp_path}"
    for opts in ({"timeout_ms": 2**32 + 50}, {"idle_timeout_ms": -2**31 - 1},
                 {"memory_limit_bytes": -1}, {"client_quota_bytes": 1 << 64}):
        with pytest.raises(tutti.InvalidArgError, match=f"{next(iter(opts))} .* out of range"):
            tutti.Store(url, **opts)
    with pytest.raises(TypeError, match="integer"):
        tutti.Store(url, timeout_ms="50")
    with tutti.Store(url, timeout_ms=2**31 - 1) as s:  # the largest a C int holds
        with pytest.raises(tutti.InvalidArgError, match="timeout_ms .* out of range"):
            tutti.Communicator(s, 0, 1, timeout_ms=2**32 + 50)


def test_call_integers_a_c_argument_cannot_hold_are_refused(store):
    """add's delta, get's and wait's timeouts: ctypes kept their low bits (add(k, 2**64 + 1)
    added 1, get(k, 2**32 + 5) waited 5 ms; review, session 100)."""
    for call, what in ((lambda: store.add("c", 2**64 + 1), "delta"),
                       (lambda: store.add("c", -2**63 - 1), "delta"),
                       (lambda: store.get("missing", 2**32 + 5), "timeout_ms"),
                       (lambda: store.wait(["missing"], 2**32 + 5), "timeout_ms")):
        with pytest.raises(tutti.InvalidArgError, match=f"{what} .* out of range"):
            call()
    assert store.add("c", 2**63 - 1) == 2**63 - 1  # the limits themselves pass
    assert store.add("d", -2**63) == -2**63


def test_a_store_under_views_or_communicators_is_not_closed(tmp_path):
    """close() of a store whose view (or a communicator made on that view) is open is
    refused: the library frees what they use, and their next call crashed the process
    (review, session 100). Closed in order, everything goes."""
    s = tutti.Store(f"file://{tmp_path}")
    v = s.prefixed("grp/")
    vv = v.prefixed("sub/")
    c = tutti.Communicator(vv, 0, 1, timeout_ms=5000)
    for st in (s, v):
        with pytest.raises(tutti.Error, match="communicator"):
            st.close()
    c.destroy()
    with pytest.raises(tutti.Error, match="open view"):
        s.close()
    with pytest.raises(tutti.Error, match="open view"):
        v.close()
    vv.set("k", b"1")
    assert v.get("sub/k", 0) == b"1"  # all still usable
    vv.close()
    v.close()
    s.close()


def test_a_store_with_a_call_in_another_thread_is_not_closed(tmp_path):
    """close() while another thread waits in get() is refused (it freed the handle under
    the call: SIGSEGV; review, session 100); once the call returned, it closes."""
    import threading
    import time
    s = tutti.Store(f"file://{tmp_path}")
    out = []

    def waiter():
        try:
            s.get("never", 1500)
        except tutti.Error as e:
            out.append(type(e).__name__)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.3)
    with pytest.raises(tutti.Error, match="in use by 1 call"):
        s.close()
    t.join(10)
    assert out == ["TimeoutError"], out
    s.close()
