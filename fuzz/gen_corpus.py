#!/usr/bin/env python3
"""Writes the seed corpora (corpus/NAME/seed-*) from the wire formats in lib/store/store_impl.h
and transports/tcp/tcp.h: valid exchanges and a few near misses, for the fuzzers to start
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
SET, GET, ADD, CAS, CHECK, DELETE, WAIT, PING, HELLO, AUTH, DELPREFIX, CAD = range(1, 13)


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
