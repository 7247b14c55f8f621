#!/usr/bin/env bash
# tutti's one entry point on a fresh Debian 12 machine (as root, or with sudo):
#   ./run.sh bench   install what is missing, build, run tutti-bench allreduce on 4 local ranks
#   ./run.sh test    install what is missing, check the C style (.clang-format), build, run
#                    the whole test suite, then again under ASan+UBSan, the fuser's suite
#                    under TSan, the fuzz targets (fuzz/, libFuzzer) for FUZZ_SECONDS each
#                    (default 8, two at a time: CI has 30 minutes; a fresh clone here
#                    took 1296 s in session 109; CI took 1253 s for session 107's),
#                    then the ibverbs suites on soft-RoCE
#                    inside a qemu guest (tests/rdma/ci.sh;
#                    TUTTI_RXE_VM=0 skips that step)
# Extra arguments after `bench` go to tutti-bench (e.g. ./run.sh bench -np 2 -e 1G).
set -euo pipefail
cd "$(dirname "$0")"

# gdb: a test rank that outlives its deadline gets its stacks printed (tests/harness.c)
PKGS=(gcc libc6-dev pkg-config meson ninja-build libuv1-dev check libibverbs-dev libssl-dev openssl procps gdb)
# the fuzz step of `test`: clang and its libFuzzer runtime (libclang_rt.fuzzer)
FUZZ_PKGS=(clang-14 libclang-rt-14-dev)
# the RDMA step of `test`: a qemu guest with Debian's kernel and soft-RoCE (tests/rdma/)
VM_PKGS=(qemu-system-x86 busybox-static cpio kmod)

install_deps() { # packages... (default: PKGS)
    local missing=()
    [ $# -gt 0 ] || set -- "${PKGS[@]}"
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "run.sh: installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -q
    # no daemon of a package (sshd, redis, slurm) started by its install: the tests
    # start their own, on loopback or in their own namespaces (a policy-rc.d of ours,
    # only where there is none)
    local policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null &&
            $sudo chmod 755 /usr/sbin/policy-rc.d && policy=1
    fi
    # (a subshell, so that its EXIT trap takes ours away on every way out, Ctrl-C too)
    (
        [ -z "$policy" ] || trap '$sudo rm -f /usr/sbin/policy-rc.d' EXIT
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
    )
}

# each step's time and the total so far, for CI's log (its limit is 30 minutes)
step_t0=$SECONDS
step() { # name
    echo "run.sh: $1: $((SECONDS - step_t0)) s (total $SECONDS s)"
    step_t0=$SECONDS
}

build() { # dir, extra meson args...
    local dir=$1; shift
    [ -f "$dir/build.ninja" ] || meson setup "$dir" "$@"
    ninja -C "$dir"
}

cmd=${1:-}
shift || true
case "$cmd" in
bench)
    install_deps
    build build
    if [ $# -eq 0 ]; then set -- -np 4 -b 8 -e 64M -f 4 -c; fi
    exec build/bench/tutti-bench --coll allreduce "$@"
    ;;
test)
    install_deps
    install_deps clang-format-14
    install_deps python3-numpy python3-pytest # the python suite (python/tests)
    install_deps iproute2 # tests/test_netns_tcp.sh: two hosts as network namespaces
    install_deps openssh-server openssh-client # tests/test_ssh.sh: tutti-run -H through sshd
    install_deps openmpi-bin mpich # tests/test_mpirun.sh: ranks the MPI launchers start
    install_deps python3-mpi4py # python/tests/test_mpi4py.py: Communicator.from_mpi
    install_deps slurmctld slurmd slurm-client # tests/test_slurm.sh: a single-host Slurm
    install_deps redis-server # the redis:// store (tests/test_store.c starts its own servers)
    # tutti.torch, the torch.distributed backend, and its tests (python/tests/test_torch_*)
    install_deps python3-torch libtorch-dev pybind11-dev g++
    step "packages"
    tools/dev/format.sh --check # the tree follows .clang-format
    build build
    step "format check and build"
    # 4 at a time: only the suites that mostly wait run side by side (tests/meson.build)
    meson test -C build --print-errorlogs --num-processes 4
    step "tests"
    # Sanitizers: the same suite, with the big cases shrunk (TT_TEST_QUICK) for time, but
    # the launcher's (84 s run alone, not in parallel: its timing cases; the plain run
    # has it; session 86 took it out when CI reached 30 minutes).
    build build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dpeers=disabled -Dtorch=disabled
    TT_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
        UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        meson test -C build-asan --print-errorlogs --timeout-multiplier 3 --num-processes 4 \
        --no-suite launcher
    step "ASan/UBSan build and tests"
    # ThreadSanitizer over the fuser's lock-free marks and the executor it feeds, and the
    # flight recorder (its ring under the executor's lock, dumps and the idle thread's
    # watch), and a revoke from another thread than the one blocked in the op
    # (test_split's revoke_then_shrink), and the store server's threads (its embedded
    # server serves from a thread of rank 0), and stream-ordered device calls (the stand-in
    # CUDA driver's stream threads, the progress thread, the caller; test_device's cuda
    # case, 8 s): tcp only (gcc's TSan refuses the shm transport's fences); only those
    # suites are built.
    [ -f build-tsan/build.ninja ] || meson setup build-tsan -Db_sanitize=thread \
        -Db_lundef=false -Dpeers=disabled -Dtorch=disabled -Dtransports=tcp
    ninja -C build-tsan tests/test_fuser tests/test_trace tests/test_split tests/test_store_server \
        tools/tutti-store tests/test_device tests/libfakecuda.so
    TT_TEST_QUICK=1 TSAN_OPTIONS=halt_on_error=1 \
        meson test -C build-tsan --no-rebuild --print-errorlogs --timeout-multiplier 3 fuser trace store_server
    TSAN_OPTIONS=halt_on_error=1 TUTTI_TRANSPORT=tcp CK_RUN_CASE=revoke_then_shrink \
        timeout 300 build-tsan/tests/test_split
    TSAN_OPTIONS=halt_on_error=1 TUTTI_TRANSPORT=tcp CK_RUN_CASE=cuda \
        timeout 300 build-tsan/tests/test_device
    step "TSan build and test"
    # Fuzzing, bounded: each target starts from its corpus in the tree and runs under
    # ASan+UBSan, two at a time (one per CPU here); any crash, leak or timeout fails the
    # step (the input is kept in build-fuzz/ as crash-*, to add to the corpus once fixed).
    if [ "${FUZZ_SECONDS:-8}" != 0 ]; then
        install_deps "${FUZZ_PKGS[@]}"
        [ -f build-fuzz/build.ninja ] || CC=clang-14 meson setup build-fuzz -Dfuzz=true \
            -Dpeers=disabled -Dtorch=disabled -Db_lundef=false -Dtests=false
        fuzzers=(fuzz_store_server fuzz_redis_reply fuzz_tcp_hello fuzz_tcp_frames fuzz_shm_ring
            fuzz_ib_wire fuzz_errfile)
        ninja -C build-fuzz "${fuzzers[@]/#/fuzz/}"
        failed=()
        for ((i = 0; i < ${#fuzzers[@]}; i += 2)); do
            pids=()
            for f in "${fuzzers[@]:i:2}"; do
                mkdir -p "build-fuzz/corpus-$f"
                (cd build-fuzz && exec "fuzz/$f" -max_total_time="${FUZZ_SECONDS:-8}" \
                    -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 "corpus-$f" \
                    "../fuzz/corpus/$f" >"fuzz-$f.log" 2>&1) &
                pids+=("$!")
            done
            for j in "${!pids[@]}"; do wait "${pids[j]}" || failed+=("${fuzzers[i + j]}"); done
        done
        for f in "${fuzzers[@]}"; do
            echo "run.sh: fuzz/$f:"
            grep -v -E '(NEW|REDUCE) +cov:|Uses:' "build-fuzz/fuzz-$f.log" || true
        done
        if [ ${#failed[@]} -gt 0 ]; then
            echo "run.sh: fuzzing failed in ${failed[*]} (inputs kept in build-fuzz/ as crash-*)" >&2
            exit 1
        fi
        step "fuzzing"
    fi
    # RDMA for real: this kernel has none, so the ibverbs tests above skipped ("no ibverbs
    # device"); run them, and the correctness matrices over ibverbs, on rdma_rxe in a VM.
    if [ "${TUTTI_RXE_VM:-1}" != 0 ]; then
        install_deps "${VM_PKGS[@]}"
        tests/rdma/ci.sh build
        step "ibverbs in a soft-RoCE guest"
    fi
    ;;
*)
    echo "usage: $0 bench [tutti-bench args] | test" >&2
    exit 2
    ;;
esac
