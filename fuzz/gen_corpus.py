#!/usr/bin/env python3
"""Writes the seed corpora (corpus/NAME/seed-*) from the wire formats in lib/store/store_impl.h,
transports/tcp/tcp.h, transports/shm/shm.h and transports/ibverbs/ib.h: valid exchanges and a few near misses, for the fuzzers to start
from. Run it again after a format change; inputs found by fuzzing are added beside them."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


# ---- the store server: first byte = set-up (bit 0: secret; >= 0x80: small reads) ----
SET, GET, ADD, CAS, CHECK, DELETE, WAIT, PING, HELLO, AUTH, DELPREFIX, CAD, COUNTPREFIX = range(1, 14)


def field(b):
    return struct.pack(">I", len(b)) + b


def frame(cmd, *fields):
    body = bytes([cmd]) + b"".join(field(f) for f in fields)
    return struct.pack(">I", len(body)) + body


def hello(challenge=b"", version=2):
    return frame(HELLO, b"tutti-store", struct.pack(">I", version), challenge)


session = (hello()
           + frame(SET, b"k", b"v")
           + frame(GET, b"k")
           + frame(ADD, b"n", struct.pack(">q", 5))
           + frame(ADD, b"n", struct.pack(">q", -7))
           + frame(CAS, b"c", b"", b"one")
           + frame(CAS, b"c", b"one", b"two")
           + frame(CHECK, b"k", b"c", b"x")
           + frame(WAIT, b"k", b"c")
           + frame(DELETE, b"k")
           + frame(CAD, b"c", b"two")
           + frame(SET, b"job/a", b"1") + frame(SET, b"job/b", b"2")
           + frame(COUNTPREFIX, b"job/") + frame(COUNTPREFIX, b"")
           + frame(DELPREFIX, b"job/")
           + frame(PING))
write("fuzz_store_server", "session", b"\x00" + session)
write("fuzz_store_server", "session-split", b"\x81" + session)
write("fuzz_store_server", "hello", b"\x00" + hello())
write("fuzz_store_server", "hello-old-version", b"\x00" + hello(version=1))
write("fuzz_store_server", "auth-wrong", b"\x01" + hello(b"c" * 32) + frame(AUTH, b"a" * 32))
write("fuzz_store_server", "auth-no-challenge", b"\x01" + hello())
write("fuzz_store_server", "protocol1-client", b"\x00" + frame(SET, b"k", b"v"))
write("fuzz_store_server", "get-waits", b"\x00" + hello() + frame(GET, b"never") + frame(PING))
write("fuzz_store_server", "add-not-a-number",
      b"\x00" + hello() + frame(SET, b"n", b"abc") + frame(ADD, b"n", struct.pack(">q", 1)))
write("fuzz_store_server", "many-keys",
      b"\x00" + hello() + b"".join(frame(SET, b"key%d" % i, b"v") for i in range(40)))


# ---- the tcp hello: first byte = set-up (bit 0 outgoing, bit 1 auth, bit 2 checksums,
# bits 3-7 largest read); this rank is 1 of 4, instance "job-1" ----
HELLO_MAGIC, VERDICT_MAGIC = 0x4F4C4C48, 0x54434456


def tcp_hello(rank, nranks=4, csum=0, auth=0, inst=b"job-1", version=2, challenge=b"\0" * 32):
    return struct.pack("<IIiiIIII", HELLO_MAGIC, version, rank, nranks, csum, auth,
                       len(inst), 0) + challenge + inst


def verdict(status=0, reason=b"", answer=b"\0" * 32):
    return struct.pack("<IiII", VERDICT_MAGIC, status, len(reason), 0) + answer + reason


def answer(context, challenge=b"\0" * 32):
    """fuzz_tcp_hello.c's stand-in for the HMAC"""
    return bytes(challenge[i] ^ context[i % len(context)] ^ i for i in range(32))


T = "fuzz_tcp_hello"
write(T, "in-ok", b"\x00" + tcp_hello(2) + verdict())
write(T, "in-ok-split", b"\x08" + tcp_hello(2) + verdict())
write(T, "in-refused", b"\x00" + tcp_hello(3) + verdict(-5, b"wrong instance"))
write(T, "in-other-instance", b"\x00" + tcp_hello(2, inst=b"job-2"))
write(T, "in-v1", b"\x00" + struct.pack("<IIii", HELLO_MAGIC, 1, 2, 4))
write(T, "in-not-hello", b"\x00" + b"GET / HTTP/1.1\r\n\r\n")
write(T, "in-auth", b"\x02" + tcp_hello(2, auth=1, challenge=b"\x11" * 32) + verdict())
write(T, "in-csum-mismatch", b"\x04" + tcp_hello(2))
write(T, "out-ok", b"\x01" + tcp_hello(0) + verdict() + verdict())
write(T, "out-ok-split", b"\x19" + tcp_hello(0) + verdict() + verdict())
write(T, "out-refused", b"\x01" + tcp_hello(0) + verdict(-7, b"go away"))
write(T, "out-wrong-rank", b"\x01" + tcp_hello(2) + verdict())
write(T, "out-csum", b"\x05" + tcp_hello(0, csum=1) + verdict() + verdict())
write(T, "out-auth", b"\x03" + tcp_hello(0, auth=1, challenge=b"\x22" * 32)
      + verdict(answer=answer(b"tcp-hello 0->1 job-1")) + verdict())
write(T, "out-auth-wrong", b"\x03" + tcp_hello(0, auth=1) + verdict(answer=b"\x01" * 32))


# ---- tcp frames: byte 0 (bit 0 checksums, bits 1-2 receives - 1), 2-byte lengths, then
# the peer's bytes; receives expect envelope {1, 2, 3, 4} ----
TCP_MAGIC, DATA, ERROR = 0x49545554, 1, 2
ENV = (1, 2, 3, 4)


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def tcp_frame(payload, ftype=DATA, env=ENV, csum=False):
    head = struct.pack("<IHHQ4Q", TCP_MAGIC, ftype, 0, len(payload), *env)
    hcrc = crc32c(head) if csum else 0
    out = head + struct.pack("<II", hcrc, 0) + payload
    if csum:
        out += struct.pack("<I", crc32c(payload))
    return out


def frames_input(lens, body, csum=False):
    return bytes([(1 if csum else 0) | (len(lens) - 1) << 1]) + b"".join(
        struct.pack("<H", n) for n in lens) + body


F = "fuzz_tcp_frames"
write(F, "one", frames_input([5], tcp_frame(b"hello")))
write(F, "one-csum", frames_input([5], tcp_frame(b"hello", csum=True), csum=True))
write(F, "three", frames_input([0, 3, 4096], tcp_frame(b"") + tcp_frame(b"abc")
                               + tcp_frame(b"x" * 4096)))
write(F, "three-csum", frames_input([0, 3, 5000], tcp_frame(b"", csum=True)
                                    + tcp_frame(b"abc", csum=True)
                                    + tcp_frame(b"y" * 5000, csum=True), csum=True))
write(F, "error-frame", frames_input([8], tcp_frame(b"rank 1 failed", ftype=ERROR,
                                                    env=(2**64 - 5, 0, 0, 0))))
write(F, "error-frame-csum", frames_input([8], tcp_frame(b"boom", ftype=ERROR,
                                                         env=(2**64 - 5, 0, 0, 0), csum=True),
                                          csum=True))
write(F, "mismatch-len", frames_input([4], tcp_frame(b"hello")))
write(F, "mismatch-env", frames_input([5], tcp_frame(b"hello", env=(9, 9, 9, 9))))
write(F, "cut-mid-payload", frames_input([100], tcp_frame(b"z" * 100)[:80]))
write(F, "bad-payload-crc", frames_input([5], tcp_frame(b"hello", csum=True)[:-1] + b"\0",
                                         csum=True))


# ---- shm rings: byte 0 (bits 0-1 receives - 1, 2 broken, 3 revoked, 4 report, 5-7 step
# 64 << 2k), byte 1 start line, byte 2 (bits 0-1 heads - 1, 2-7 -status), 2-byte heads
# (from the start) and lengths, then the stream; receives expect envelope {1, 2, 3, 4} ----
SHM_MAGIC, INLINE, CMA, WHOLE = 0x5453, 1, 2, 1
PEER_MEM = 1 << 63  # a pull address into the harness's buffer for the peer


def shm_rec(payload=b"", env=ENV, rtype=INLINE, addr=0, length=None, magic=SHM_MAGIC,
            whole=True, stamp=None):
    """A record as a function of its stream position (the stamp is position ^ key, and
    the harness's key is 0); a pull record's payload is its address."""
    n = len(payload) if length is None else length
    body = struct.pack("<Q", addr) if rtype == CMA else payload

    def at(pos):
        rec = struct.pack("<HHIQ4QQ", magic, rtype, WHOLE if whole else 0, n, *env,
                          pos if stamp is None else stamp) + body
        return rec + b"\0" * (-len(rec) % 64)
    return at


SHORT = 3
M64 = (1 << 64) - 1


def shm_mix64(x):
    x ^= x >> 33
    x = x * 0xFF51AFD7ED558CCD & M64
    x ^= x >> 33
    x = x * 0xC4CEB9FE1A85EC53 & M64
    return x ^ x >> 33


def shm_env_digest(env):
    """shm.h's shm_env_digest."""
    h = shm_mix64(env[0] ^ 0x9E3779B97F4A7C15)
    for w in env[1:]:
        h = shm_mix64(h ^ w)
    return h


def shm_short_rec(payload, env=ENV, digest=None, length=None):
    """A short record (shm_short_t, 9..40 bytes): length, digest and payload around the
    stamp in its first line, the envelope in its second."""
    n = len(payload) if length is None else length
    body = payload.ljust(40, b"\0")
    d = shm_env_digest(env) if digest is None else digest

    def at(pos):
        return (struct.pack("<HHIQ", SHM_MAGIC, SHORT, n, d) + body[:32] + struct.pack("<Q", pos)
                + body[32:40] + struct.pack("<4Q", *env) + b"\0" * 32)
    return at


def shm_stream(*recs, start=0):
    """Records laid out from line `start` on."""
    out = b""
    for r in recs:
        out += r(start * 64 + len(out))
    return out


def shm_input(lens, stream, heads=None, flags=0, start=0, step=5, status=0):
    heads = [len(stream)] if heads is None else heads
    return (bytes([(len(lens) - 1) | flags << 2 | step << 5, start,
                   (len(heads) - 1) | status << 2])
            + b"".join(struct.pack("<H", h) for h in heads)
            + b"".join(struct.pack("<H", n) for n in lens) + stream)


S = "fuzz_shm_ring"
three = shm_stream(shm_rec(b""), shm_rec(b"abc"), shm_rec(b"q" * 1000))
three_parts = shm_stream(shm_rec(b""), shm_rec(b"abc"), shm_rec(b"q" * 1000, whole=False))
write(S, "one", shm_input([5], shm_stream(shm_rec(b"hello"))))
write(S, "three", shm_input([0, 3, 1000], three))
write(S, "three-small-steps", shm_input([0, 3, 1000], three_parts, step=0))
write(S, "three-in-parts", shm_input([0, 3, 1000], three_parts,
                                     heads=[64, 100, 700, len(three)], step=1))
write(S, "wraps", shm_input([1000, 7], shm_stream(shm_rec(b"w" * 1000), shm_rec(b"seven!!"),
                                                  start=60), start=60))
write(S, "pull", shm_input([3000], shm_stream(shm_rec(rtype=CMA, addr=PEER_MEM | 128,
                                                      length=3000))))
write(S, "pull-then-inline", shm_input([3000, 4], shm_stream(
    shm_rec(rtype=CMA, addr=PEER_MEM, length=3000), shm_rec(b"tail"))))
write(S, "pull-bad-address", shm_input([100], shm_stream(shm_rec(rtype=CMA, addr=0x1000,
                                                                 length=100))))
write(S, "pull-revoked", shm_input([100], shm_stream(shm_rec(rtype=CMA, addr=PEER_MEM,
                                                             length=100)), flags=2))
write(S, "mismatch-len", shm_input([4], shm_stream(shm_rec(b"hello"))))
write(S, "mismatch-env", shm_input([5], shm_stream(shm_rec(b"hello", env=(9, 9, 9, 9)))))
write(S, "short", shm_input([16, 40, 5], shm_stream(shm_short_rec(b"s" * 16),
                                                    shm_short_rec(bytes(range(40))),
                                                    shm_rec(b"after"))))
write(S, "short-wraps", shm_input([33], shm_stream(shm_short_rec(b"w" * 33), start=63),
                                  start=63))
write(S, "short-mismatch-env", shm_input([16], shm_stream(shm_short_rec(b"s" * 16,
                                                                        env=(9, 9, 9, 9)))))
write(S, "short-bad-digest", shm_input([16], shm_stream(shm_short_rec(b"s" * 16, digest=7))))
write(S, "short-bad-length", shm_input([16], shm_stream(shm_short_rec(b"s" * 16, length=41))))
write(S, "bad-magic", shm_input([5], shm_stream(shm_rec(b"hello", magic=0x1234))))
write(S, "bad-type", shm_input([5], shm_stream(shm_rec(b"hello", rtype=7))))
write(S, "bad-stamp", shm_input([5], shm_stream(shm_rec(b"hello", stamp=12345))))
write(S, "huge-length", shm_input([5], shm_stream(shm_rec(b"hello", length=1 << 60))))
write(S, "report", shm_input([5], b"rank 1 failed: out of memory", heads=[0], flags=4,
                             status=5))
write(S, "broken-mid-record", shm_input([500], shm_stream(shm_rec(b"b" * 500,
                                                                  whole=False))[:200], flags=1))
write(S, "head-past-ring", shm_input([5000], shm_stream(shm_rec(b"h" * 5000,
                                                                whole=False))[:4096],
                                     heads=[8192]))


# ---- ibverbs wire: byte 0 slots - 2, byte 1 eager bytes / 16; then events: 0 imm, 1 imm
# without the immediate flag, 2 imm + error box length, 3 spend a credit, 4 next slot,
# 5 error box (64 bytes) ----
IB_MAGIC, EAGER, RTS = 0x42495454, 1, 2
IMM_DATA, IMM_CTRL, IMM_ERROR, IMM_NOP = 1, 2, 3, 4


def imm(t, a=0, b=0, op=0):
    return bytes([op]) + struct.pack(">I", t << 28 | (a & 0x3FFF) << 14 | (b & 0x3FFF))


def ib_slot(kind=EAGER, payload=b"", length=None, magic=IB_MAGIC, addr=0, rkey=0):
    n = len(payload) if length is None else length
    return b"\x04" + struct.pack("<IHHIIQQ4Q", magic, kind, 0, rkey, 0, n, addr, *ENV) + payload


SPEND = b"\x03"
B = "fuzz_ib_wire"
write(B, "exchange", bytes([2, 16]) + SPEND * 2 + imm(IMM_DATA) + imm(IMM_DATA)
      + ib_slot(payload=b"hello") + ib_slot(payload=b"world") + imm(IMM_CTRL, a=2))
write(B, "rts", bytes([2, 16]) + SPEND + imm(IMM_DATA) + ib_slot(RTS, length=1 << 20,
                                                               addr=0x7F0000001000, rkey=7)
      + imm(IMM_CTRL, a=1, b=1) + imm(IMM_NOP))
write(B, "error", bytes([2, 16]) + b"\x05" + b"rank 1 failed: out of memory".ljust(64, b"\0")
      + imm(IMM_ERROR, b=5, op=2) + struct.pack("<H", 28))
write(B, "error-long", bytes([2, 16]) + b"\x05" + b"x" * 64 + imm(IMM_ERROR, b=0x3FFF, op=2)
      + struct.pack("<H", 0xFFFF))
write(B, "too-many-credits", bytes([2, 16]) + SPEND + imm(IMM_CTRL, a=2))
write(B, "ring-full", bytes([2, 16]) + imm(IMM_DATA) * 5)
write(B, "bad-magic", bytes([2, 16]) + imm(IMM_DATA) + ib_slot(payload=b"x", magic=1))
write(B, "eager-too-long", bytes([2, 1]) + imm(IMM_DATA) + ib_slot(payload=b"y" * 17))
write(B, "eager-full-slot", bytes([2, 4]) + imm(IMM_DATA) + ib_slot(payload=b"z" * 64))
write(B, "no-immediate", bytes([2, 16]) + imm(IMM_DATA, op=1))
write(B, "unknown-type", bytes([2, 16]) + imm(9))

# connection datagrams (event 6), to rank 1 of 4 in instance 0x1122334455667788: see
# ib_ud_msg_t in transports/ibverbs/ib.h
UD_MAGIC, LAZY_MAGIC, UD_REQ, UD_REP, UD_REJ = 0x55444954, 0x5A4C4954, 1, 2, 3
INST = 0x1122334455667788


def ud(kind=UD_REQ, frm=0, to=1, auth=0, inst=INST, reason=0, dev=b"rxe0", nranks=4,
       cut=None):
    port = struct.pack("<IIiiIIHBBI16s32sB3x", LAZY_MAGIC, 2, frm, nranks, 32, 8256, 0, 3, 2,
                       1, bytes(10) + b"\xff\xff\xc0\x00\x02\x01", dev, 16)
    qp = struct.pack("<IIQII", 0 if kind == UD_REJ else 0x11, 0 if kind == UD_REJ else 0x1234,
                     0 if kind == UD_REJ else 0x7F0000002000, 0 if kind == UD_REJ else 9, reason)
    m = struct.pack("<IHHiiQ", UD_MAGIC, kind, auth, frm, to, inst) + port + bytes(4) + qp
    m += bytes(64)
    assert len(m) == 200
    m = m[:cut] if cut is not None else m
    return b"\x06" + bytes([len(m)]) + m


write(B, "ud-req-rep", bytes([2, 16]) + ud() + ud(UD_REP, frm=2))
write(B, "ud-req-auth", bytes([2, 16]) + ud(auth=1))
write(B, "ud-rej", bytes([2, 16]) + ud(UD_REJ, frm=3, reason=1))
write(B, "ud-rej-auth", bytes([2, 16]) + ud(UD_REJ, auth=1, reason=1))
write(B, "ud-rej-reason", bytes([2, 16]) + ud(UD_REJ, reason=9))
write(B, "ud-short", bytes([2, 16]) + ud(cut=100))
write(B, "ud-other-job", bytes([2, 16]) + ud(inst=INST + 1))
write(B, "ud-to-self", bytes([2, 16]) + ud(frm=1))
write(B, "ud-unterminated-dev", bytes([2, 16]) + ud(dev=b"x" * 32))
write(B, "ud-other-size", bytes([2, 16]) + ud(nranks=5))


# ---- the redis client's replies: 2 bytes = how many follow already buffered ----
def redis(name, replies, split=0):
    write("fuzz_redis_reply", name, struct.pack(">H", split) + replies)


redis("simple", b"+OK\r\n+PONG\r\n-ERR wrong\r\n:42\r\n:-7\r\n")
redis("bulk", b"$5\r\nhello\r\n$0\r\n\r\n$-1\r\n", split=9)
redis("scan", b"*2\r\n$1\r\n0\r\n*3\r\n$1\r\na\r\n$1\r\nb\r\n$2\r\ncc\r\n", split=20)
redis("nested", b"*1\r\n*1\r\n*2\r\n:1\r\n$-1\r\n*-1\r\n*0\r\n")
redis("bad", b"$3\r\nabcXY:12x\r\n")


# ---- torch's error files, as tutti-run reads them (tools/errfile.h) ----
def errfile(name, text):
    write("fuzz_errfile", name, text.encode())


errfile("torch", '{"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": '
        '"Traceback (most recent call last):\\n  File \\"t.py\\", line 3, in <module>\\n'
        'ValueError: boom\\n", "timestamp": "1764840000"}}}')
errfile("string", '{"message": "out of memory", "timestamp": 1764840000}')
errfile("no-callstack", '{"message": {"message": "KeyError: k", "extraInfo": {}, "errorCode": 3}}')
errfile("escapes", '{"message": {"extraInfo": {"py_callstack": "\\u00e9\\ud83d\\ude00\\ud800 \\/\\b\\f'
        '\\r\\t\\\\", "timestamp": 1.5e9}}, "other": [1, -2.5, true, false, null, {"a": []}]}')
errfile("empty-object", '{"message": {}}')
errfile("deep", '{"message": {"x": ' + "[" * 80 + "]" * 80 + "}}")
errfile("truncated", '{"message": {"message": "cut')
errfile("bad-escape", '{"message": "\\x41"}')
errfile("no-message", '{"msg": "x"}')
errfile("trailing", '{"message": "x"} junk')
