#!/usr/bin/env bash
# Type-checks tutti's c10d backend (python/tutti/torch/csrc/) against a torch 2.x source
# tree's headers: g++ -fsyntax-only -Wall -Wextra -Werror, no link, no run. For a machine
# with only torch 1.x installed; not part of CI. Needs g++, pybind11-dev, python3-yaml.
#   tools/dev/check-torch2.sh --extract GITDIR SRC   copy the needed parts of a pytorch
#                                                    checkout (bare git dir) into SRC
#   tools/dev/check-torch2.sh SRC [GEN]              generate the headers the build would
#                                                    (into GEN, default SRC.gen) and compile
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
py=/usr/bin/python3 # Debian's, with python3-yaml for torchgen

# Missing blobs (large files of a partial snapshot) are skipped: none is a header.
extract() {
    local git=$1 src=$2
    mkdir -p "$src"
    git --git-dir="$git" ls-tree -r HEAD -- c10 aten/src torch/csrc torchgen version.txt \
        CMakeLists.txt torch/custom_class.h torch/custom_class_detail.h torch/extension.h \
        torch/library.h torch/script.h torch/distributed/distributed_c10d.py |
        awk '$2 == "blob" { print $3 "\t" $4 }' >"$src/.files"
    cut -f1 "$src/.files" | git --git-dir="$git" cat-file --batch >"$src/.blobs"
    "$py" - "$src" <<'EOF'
import os, sys
src = sys.argv[1]
rows = [l.split("\t", 1) for l in open(os.path.join(src, ".files")).read().splitlines()]
blobs = open(os.path.join(src, ".blobs"), "rb")
for _, path in rows:
    head = blobs.readline().split()
    if head[1] == b"missing":
        print("check-torch2: not in the snapshot:", path)
        continue
    data = blobs.read(int(head[2]))
    blobs.read(1)
    os.makedirs(os.path.dirname(os.path.join(src, path)) or src, exist_ok=True)
    open(os.path.join(src, path), "wb").write(data)
EOF
    rm -f "$src/.files" "$src/.blobs"
    echo "check-torch2: torch $(cat "$src/version.txt") in $src ($(git --git-dir="$git" rev-parse HEAD))"
}

# torch/version.h and c10's cmake_macros.h by hand (as CMake would, shared-library build),
# ATen's headers by torchgen unless the snapshot carries them already.
generate() {
    local src=$1 gen=$2 ver
    ver=$(sed 's/[^0-9.].*//' "$src/version.txt")
    mkdir -p "$gen/torch" "$gen/c10/macros" "$gen/ATen"
    IFS=. read -r major minor patch <<<"$ver"
    sed "s/@TORCH_VERSION_MAJOR@/$major/g; s/@TORCH_VERSION_MINOR@/$minor/g;
         s/@TORCH_VERSION_PATCH@/${patch:-0}/g" \
        "$src/torch/csrc/api/include/torch/version.h.in" >"$gen/torch/version.h"
    sed 's|#cmakedefine C10_BUILD_SHARED_LIBS|#define C10_BUILD_SHARED_LIBS|;
         s|#cmakedefine \(.*\)|/* #undef \1 */|' \
        "$src/c10/macros/cmake_macros.h.in" >"$gen/c10/macros/cmake_macros.h"
    if [ ! -f "$src/aten/src/ATen/core/TensorBody.h" ] && [ ! -f "$gen/ATen/core/TensorBody.h" ]; then
        (cd "$src" && nice -n 19 "$py" -m torchgen.gen -s aten/src/ATen -d "$gen/ATen" \
            --generate headers)
    fi
}

check() {
    local src=$1 gen=$2 std flags f out
    std=$(grep -A1 'set(CMAKE_CXX_STANDARD' "$src/CMakeLists.txt" 2>/dev/null |
          grep -o '[0-9][0-9]' | head -1 || true)
    flags=(-std=c++"${std:-17}" -Wall -Wextra -Werror -D_GLIBCXX_USE_CXX11_ABI=1
           -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H
           -I"$gen" -isystem "$src" -isystem "$src/aten/src"
           -isystem "$src/torch/csrc/api/include"
           -isystem "$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
           -I"$repo/include" -I"$repo/python/tutti/torch/csrc")
    # MetaX-MACA/mcPytorch (a 2.4.0 snapshot) asserts in c10 unless built for MACA
    if grep -q 'for MACA check' "$src/c10/macros/Macros.h"; then flags+=(-DUSE_MACA); fi
    for f in process_group.cpp module.cpp; do
        echo "check-torch2: $f"
        nice -n 19 g++ "${flags[@]}" -fsyntax-only "$repo/python/tutti/torch/csrc/$f"
        # a header missing from SRC would be taken from /usr/include (torch 1.x) silently
        out=$(nice -n 19 g++ "${flags[@]}" -M "$repo/python/tutti/torch/csrc/$f" |
              tr ' \\' '\n\n' | grep -E '^/usr/include/(torch|ATen|c10|caffe2)/' || true)
        if [ -n "$out" ]; then
            echo "check-torch2: $f reached installed torch headers:" >&2
            echo "$out" | head >&2
            exit 1
        fi
    done
    # the 2.x branch is the one compiled
    printf '#include "process_group.hpp"\nstatic_assert(std::is_base_of<c10d::Backend, %s>::value);\n' \
        tutti_torch::ProcessGroupTutti |
        nice -n 19 g++ "${flags[@]}" -fsyntax-only -x c++ -
    grep -n 'def register_backend' "$src/torch/distributed/distributed_c10d.py" || true
    grep -n 'creator_fn(backend_prefix_store' "$src/torch/distributed/distributed_c10d.py" || true
    echo "check-torch2: OK against torch $(cat "$src/version.txt") headers (syntax and types only)"
}

if [ "${1:-}" = --extract ]; then
    [ $# = 3 ] || { echo "usage: $0 --extract GITDIR SRC" >&2; exit 2; }
    extract "$2" "$3"
    exit 0
fi
[ $# -ge 1 ] || { echo "usage: $0 SRC [GEN] | $0 --extract GITDIR SRC" >&2; exit 2; }
src=$(cd "$1" && pwd)
gen=${2:-$src.gen}
generate "$src" "$gen"
check "$src" "$(cd "$gen" && pwd)"
