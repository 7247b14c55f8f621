#!/bin/bash
# CI's RDMA step: run the ibverbs transport's tests for real, on a soft-RoCE (rdma_rxe)
# device inside a qemu guest (run-in-vm.sh), and fail if they fail.
#   tests/rdma/ci.sh [BUILD_DIR]     (default: build)
# Inside the guest (guest-suite.sh), with TUTTI_TRANSPORT=ibverbs: test_ibverbs (no-device
# path, registration cache, QP error, every collective on 2/3/4 ranks up to 3 MiB), then
# the shared correctness matrices of test_collectives (1..3 and 8 ranks, every
# algorithm, dtype and op; TT_TEST_QUICK sizes; not the "hosts" cases, which pick shm
# and tcp themselves), then a few tutti-bench rows for the
# record (rxe under TCG: correctness, not speed).
# Env: TUTTI_RXE_CACHE (download cache, default /var/cache/tutti-rxe), TUTTI_RXE_BENCH=0
# skips the benchmark rows.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
B=${1:-build}
for f in tests/test_ibverbs tests/test_collectives tests/test_conformance tests/test_mux tests/test_p2p \
    bench/tutti-bench; do
    if [ ! -x "$B/$f" ]; then
        echo "tests/rdma/ci.sh: $B/$f is missing (is libibverbs-dev installed, and the ibverbs" \
            "transport built?)" >&2
        exit 1
    fi
done
exec "$HERE/run-in-vm.sh" -t "${TUTTI_RXE_TIMEOUT:-1200}" \
    -f "$B/tests/test_ibverbs" -f "$B/tests/test_collectives" \
    -f "$B/tests/test_conformance" -f "$B/tests/test_mux" -f "$B/tests/test_p2p" \
    -f "$B/bench/tutti-bench" -f "$HERE/guest-suite.sh" \
    -- /payload/guest-suite.sh "${TUTTI_RXE_BENCH:-1}"
