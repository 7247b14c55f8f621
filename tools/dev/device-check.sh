#!/usr/bin/env bash
# The torch 2.x and GPU checks of tutti.torch, for the machine the device tool lends some
# sessions (one NVIDIA GPU, torch 2.x with CUDA, meson and ninja, no libuv or check, no
# network). Not part of CI: CI has no GPU.
#   tools/dev/device-check.sh prepare   here: fetch the Debian packages the build needs
#                                       (libuv, check, pkgconf) into .dev/debs
#   tools/dev/device-check.sh quick     there: the C library's part only (build, test_device,
#                                       tutti-bench, python/tests/test_device.py): 2 minutes
#   tools/dev/device-check.sh run       there (run with carry [".dev"]): unpack them under
#                                       /tmp/deps, build into /tmp/b with -Dtorch=enabled,
#                                       run tests/test_device (the C library's CUDA
#                                       buffers), the torch tests (CPU and CUDA tensors), the
#                                       upstream slice, then time allreduce of CUDA tensors
#                                       on tutti and gloo (bench/py_bench.py --device cuda,
#                                       A B A B); logs in $OUT
# About 5 minutes there (build 35 s, tests 3 min, timings 1 min); give the call
# timeout_s 480.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"

prepare() {
    mkdir -p .dev/debs
    grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo /.dev/ >>.git/info/exclude
    (cd .dev/debs && apt-get download libuv1 libuv1-dev check libsubunit0 libsubunit-dev \
        pkgconf pkgconf-bin libpkgconf3)
    ls -la .dev/debs
}

run() {
    local quick=${1:-0}
    local out=${OUT:-/tmp/device-check}
    mkdir -p "$out"
    exec > >(tee "$out/summary.log") 2>&1
    nvidia-smi -L
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
    mkdir -p /tmp/deps
    for f in .dev/debs/*.deb; do dpkg -x "$f" /tmp/deps; done
    for p in /tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do
        sed -i 's|^prefix=/usr$|prefix=/tmp/deps/usr|; s|^libdir=/usr|libdir=${prefix}|;
                s|^includedir=/usr|includedir=${prefix}|' "$p"
    done
    export PATH=/tmp/deps/usr/bin:$PATH PKG_CONFIG_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig
    export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    local t0=$SECONDS
    # -Dwerror=false: a new compiler's new warning is reported, not a stop
    if ! meson setup /tmp/b -Dtorch=enabled -Dpeers=disabled -Dtransports=tcp,shm \
        -Dwerror=false >"$out/setup.log" 2>&1; then
        tail -30 "$out/setup.log"
        return 1
    fi
    grep -i "stdc\|torch" "$out/setup.log" | head
    if ! ninja -C /tmp/b >"$out/build.log" 2>&1; then
        grep -B2 -A12 'error' "$out/build.log" | head -80
        return 1
    fi
    echo "build: $((SECONDS - t0)) s, warnings: $(grep -c 'warning:' "$out/build.log")"
    grep -A6 'warning:' "$out/build.log" | head -40
    # the C library's device buffers (lib/device/): the fake-device cases and the real
    # CUDA one (cuMemAlloc'ed buffers, TUTTI_CUDA=on), over tcp and shm
    local tp
    for tp in tcp shm; do
        t0=$SECONDS
        (cd /tmp/b && TUTTI_SOCKET_IFNAME=lo TUTTI_TRANSPORT=$tp timeout 150 tests/test_device) \
            >"$out/test_device-$tp.log" 2>&1
        echo "test_device ($tp): rc $? in $((SECONDS - t0)) s"
        grep -E "CUDA device|skipped|Checks|:F:|:E:" "$out/test_device-$tp.log" | head -12
    done
    # tutti-bench on device buffers against host buffers, 2 ranks over shm (and 1 rank:
    # the staging alone, no second process on the GPU), A B A B, every result checked (-c)
    local dv np
    for np in 2 1; do
        for k in 1 2; do
            for dv in cuda stream host; do
                # stream: the calls stream-ordered (--stream), each with its stream sync
                TUTTI_SOCKET_IFNAME=lo timeout 120 /tmp/b/bench/tutti-bench -np $np \
                    $([ $dv = stream ] && echo --stream || echo --device $dv) \
                    -c -b 4 -e 64M -f 16 -n 20 -w 3 >"$out/bench-$np-$dv-$k.log" 2>&1
                echo "tutti-bench -np $np --device $dv ($k): rc $?"
                grep -E "^ +[0-9]|buffers in|Out of" "$out/bench-$np-$dv-$k.log" | cut -c1-120
            done
        done
    done
    (cd /tmp/b && meson test --no-rebuild bench_device >/dev/null 2>&1; echo "bench_device: rc $?")
    export PYTHONPATH=/tmp/b/python TUTTI_SOCKET_IFNAME=lo PYTHONDONTWRITEBYTECODE=1 \
        TUTTI_RUN=/tmp/b/tools/tutti-run
    local t tests="test_device test_torch_backend test_torch_upstream"
    [ "$quick" = 1 ] && tests=test_device
    for t in $tests; do
        t0=$SECONDS
        timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 150 -rs \
            "python/tests/$t.py" >"$out/$t.log" 2>&1
        echo "$t: rc $? in $((SECONDS - t0)) s"
        grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$out/$t.log" | cut -c1-240 | head -30
    done
    [ "$quick" = 1 ] && return 0
    # CUDA tensors staged through host memory, tutti against gloo (which stages them too):
    # 2 ranks on the GPU(s), alternating runs, p50 per call in us
    local b n api k
    for b in 4:2000 1048576:200 67108864:20; do
        n=${b#*:} b=${b%:*}
        for k in 1 2; do
            for api in torch-tutti torch-gloo; do
                PYTHONPATH=$PYTHONPATH:bench timeout 60 python3 bench/py_bench.py --api $api \
                    --device cuda -np 2 -b "$b" -n "$n" -w $((n / 10 + 1)) 2>&1 | tail -1
            done
        done
    done | tee "$out/cuda-bench.jsonl"
}

case "${1:-}" in
prepare) prepare ;;
run) run ;;
quick) run 1 ;;
*)
    sed -n '2,14p' "$0"
    exit 2
    ;;
esac
