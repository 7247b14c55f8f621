#!/usr/bin/env bash
# The tree's C style is .clang-format (clang-format 14).
#   tools/dev/format.sh           reformat every C source and header in place
#   tools/dev/format.sh --check   list the files that differ and fail if any do
set -euo pipefail
cd "$(dirname "$0")/../.."
cf=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$cf" ]; then
    echo "format.sh: clang-format not found (apt-get install clang-format-14)" >&2
    exit 2
fi
mapfile -t files < <(find include lib algorithms transports tools tests fuzz bench \
    -name '*.[ch]' -not -path '*/corpus/*' | sort)
if [ "${1:-}" = --check ]; then
    bad=0
    for f in "${files[@]}"; do
        "$cf" --dry-run --Werror "$f" >/dev/null 2>&1 || { echo "not formatted: $f"; bad=1; }
    done
    [ $bad = 0 ] && echo "format.sh: ${#files[@]} files follow .clang-format"
    exit $bad
fi
"$cf" -i "${files[@]}"
