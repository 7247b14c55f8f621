#!/usr/bin/env bash
# run-peers.sh: tutti-bench, gloo-bench (every Gloo allreduce algorithm, broadcast and
# barrier) and Open MPI (MPI_Allreduce/MPI_Bcast/MPI_Barrier over TCP and over shared
# memory) side by side on this host, loopback only. Each (peer, collective, ranks) runs
# R times; the table cell is the median over the repeats of the in-place half (Gloo has
# only in-place collectives). Writes markdown tables, per (collective, ranks), of busbw
# and of time, to the -o file.
#
#   bench/peers/run-peers.sh [-o FILE] [-R REPEATS] [--ranks "2 4"] [--colls "..."]
#                            [--big] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]
#                            [--check] [--build DIR] [--peers LIST] [--keep] [--from DIR]
#
# A peer that is missing (no gloo-bench built, no mpicc/mpirun) is skipped with a note;
# a run that fails is noted and the others go on.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

out="$root/docs/benchmarks-latest.md"
repeats=3
ranks_list="2 4"
colls="allreduce broadcast barrier"
min_b=4
max_b=64M
factor=4
iters=20
warmup=5
check=""
build=""
keep=0
from=""
peers="tutti gloo ompi"
run_timeout=900

usage() {
    sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    cat <<EOF
Options:
  -o FILE        markdown output (default docs/benchmarks-latest.md)
  -R REPEATS     runs per configuration, median taken (default 3)
  --ranks LIST   rank counts (default "2 4")
  --colls LIST   collectives (default "allreduce broadcast barrier")
  --big          sizes up to 256M instead of 64M
  -b/-e/-f       size range and factor (default 4 .. 64M, x4)
  -n/-w          timed/warmup iterations per size (default 20/5)
  --check        pass -c (verify results) to every benchmark
  --build DIR    meson build dir with bench/tutti-bench (default: build-bench, then build)
  --peers LIST   which to run (default "tutti gloo ompi")
  --keep         keep the raw outputs (their dir is printed)
  --from DIR     run nothing: rebuild the tables from the raw outputs kept in DIR
                 (pass the flags of that run too: they fill the header)
EOF
}

while [ $# -gt 0 ]; do
    case "$1" in
    -o) out=$2; shift ;;
    -R | --repeats) repeats=$2; shift ;;
    --ranks) ranks_list=$2; shift ;;
    --colls) colls=$2; shift ;;
    --big) max_b=256M ;;
    -b) min_b=$2; shift ;;
    -e) max_b=$2; shift ;;
    -f) factor=$2; shift ;;
    -n) iters=$2; shift ;;
    -w) warmup=$2; shift ;;
    --check) check="-c" ;;
    --build) build=$2; shift ;;
    --peers) peers=$2; shift ;;
    --keep) keep=1 ;;
    --from) from=$2; keep=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run-peers.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

if [ -n "$from" ]; then
    work=$from
    [ -f "$work/results" ] || { echo "run-peers.sh: no results in $work" >&2; exit 2; }
else
    work=$(mktemp -d /tmp/run-peers.XXXXXX) || exit 1
fi
cleanup() {
    if [ "$keep" = 1 ]; then echo "raw outputs kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
notes="$work/notes"
results="$work/results"
note() { echo "- $*" >>"$notes"; echo "run-peers: $*" >&2; }

# Build what is missing and run everything, filling $notes and $results.
measure() {
: >"$notes"
: >"$results"

# --- find or build the benchmarks -------------------------------------------------
wants() { case " $peers " in *" $1 "*) return 0 ;; esac; return 1; }
if [ -z "$build" ]; then
    for d in build-bench build; do
        if [ -x "$root/$d/bench/tutti-bench" ]; then build="$root/$d"; break; fi
    done
fi
tutti_bin=""
if ! wants tutti; then
    :
elif [ -n "$build" ] && [ -x "$build/bench/tutti-bench" ]; then
    tutti_bin="$build/bench/tutti-bench"
else
    note "tutti-bench not built (meson setup build-bench && ninja -C build-bench): skipped"
fi

# tutti's shared-memory transport, if this build has it (compared with ompi sm)
tutti_shm=0
if [ -n "$tutti_bin" ] && TUTTI_TRANSPORT=shm "$tutti_bin" -np 2 -b 4 -e 4 -n 1 -w 0 \
    >/dev/null 2>&1; then
    tutti_shm=1
elif [ -n "$tutti_bin" ]; then
    note "tutti's shm transport is not in this build: tutti shm skipped"
fi

gloo_bin=""
if ! wants gloo; then
    :
elif [ -n "$build" ] && [ -x "$build/bench/peers/gloo-bench" ]; then
    gloo_bin="$build/bench/peers/gloo-bench"
elif command -v g++ >/dev/null && [ -f /usr/include/gloo/allreduce_ring.h ]; then
    # Not built by meson (e.g. -Dpeers=disabled): build it by hand.
    if g++ -std=c++17 -O2 -o "$work/gloo-bench" "$here/gloo_bench.cc" -lgloo -lpthread \
        2>"$work/gloo-build.log"; then
        gloo_bin="$work/gloo-bench"
    else
        note "gloo-bench failed to build ($(head -c 300 "$work/gloo-build.log")): skipped"
    fi
else
    note "Gloo not found (needs libgloo-dev and g++): skipped"
fi

mpi_bin=""
if ! wants ompi; then
    :
elif command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
    if mpicc -O2 -std=gnu11 -o "$work/mpi-bench" "$here/mpi_bench.c" -lm \
        2>"$work/mpi-build.log"; then
        mpi_bin="$work/mpi-bench"
    else
        note "mpi-bench failed to build ($(head -c 300 "$work/mpi-build.log")): skipped"
    fi
else
    note "mpicc/mpirun not found (needs openmpi-bin and libopenmpi-dev): skipped"
fi
mpirun_args=(--oversubscribe --bind-to none --mca pml ob1 --mca oob_tcp_if_include lo)
[ "$(id -u)" = 0 ] && mpirun_args+=(--allow-run-as-root)

# --- run -----------------------------------------------------------------------
# results: "peer ranks coll size time_us busbw" per row per repeat (in-place half).
sizes=(-b "$min_b" -e "$max_b" -f "$factor" -n "$iters" -w "$warmup")

# run_one PEER RANKS COLL REPEAT CMD...: run, keep the output, append its rows.
run_one() {
    local peer=$1 n=$2 coll=$3 rep=$4
    shift 4
    local log="$work/$peer.$coll.np$n.r$rep.txt"
    echo "run-peers: $peer $coll np=$n repeat $rep" >&2
    local rc=0
    timeout "$run_timeout" "$@" >"$log" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
        note "$peer $coll np=$n repeat $rep failed (rc $rc): $(grep -v '^#' "$log" |
            grep -v '^ *[0-9]' | tail -n 2 | tr '\n' ' ' | head -c 300)"
    fi
    # Data rows start with the size; the in-place half is the last six fields:
    # time algbw busbw #wrong p50 p99.
    awk -v p="$peer" -v n="$n" -v c="$coll" \
        '$1 ~ /^[0-9]+$/ && NF >= 11 { print p, n, c, $1, $(NF-5), $(NF-3) }' \
        "$log" >>"$results"
}

for n in $ranks_list; do
    for coll in $colls; do
        for rep in $(seq 1 "$repeats"); do
            if [ -n "$tutti_bin" ]; then
                run_one tutti "$n" "$coll" "$rep" env TUTTI_TRANSPORT=tcp \
                    "$tutti_bin" -np "$n" --coll "$coll" "${sizes[@]}" $check
                if [ "$tutti_shm" = 1 ]; then
                    run_one tutti_shm "$n" "$coll" "$rep" env TUTTI_TRANSPORT=shm \
                        "$tutti_bin" -np "$n" --coll "$coll" "${sizes[@]}" $check
                fi
            fi
            if [ -n "$gloo_bin" ]; then
                case $coll in
                allreduce) algos="ring ring_chunked halving_doubling bcube" ;;
                *) algos=$coll ;;
                esac
                for a in $algos; do
                    run_one "gloo:$a" "$n" "$coll" "$rep" \
                        "$gloo_bin" -np "$n" --algo "$a" "${sizes[@]}" $check
                done
            fi
            if [ -n "$mpi_bin" ]; then
                run_one ompi_tcp "$n" "$coll" "$rep" mpirun "${mpirun_args[@]}" -np "$n" \
                    --mca btl tcp,self --mca btl_tcp_if_include lo \
                    "$mpi_bin" --coll "$coll" "${sizes[@]}" $check
                run_one ompi_sm "$n" "$coll" "$rep" mpirun "${mpirun_args[@]}" -np "$n" \
                    --mca btl vader,self "$mpi_bin" --coll "$coll" "${sizes[@]}" $check
            fi
        done
    done
done

}
[ -n "$from" ] || measure

# --- medians ---------------------------------------------------------------------
# "peer ranks coll size" -> median time and median busbw over the repeats.
median() { # column 5 (time) or 6 (busbw)
    sort -k1,1 -k2,2n -k3,3 -k4,4n -k"$1","$1"g "$results" | awk -v col="$1" '
        function flush() { if (k != "") print k, v[int((m + 1) / 2)] }
        { key = $1 " " $2 " " $3 " " $4
          if (key != k) { flush(); k = key; m = 0 }
          v[++m] = $col }
        END { flush() }'
}
median 5 >"$work/med_time"
median 6 >"$work/med_bw"

# --- tables ----------------------------------------------------------------------
human() {
    awk -v b="$1" 'BEGIN {
        split("B KiB MiB GiB", u, " "); i = 1
        while (b >= 1024 && b % 1024 == 0 && i < 4) { b /= 1024; i++ }
        printf "%d %s", b, u[i] }'
}

# table KIND(time|bw) RANKS COLL: markdown rows for one (collective, ranks).
table() {
    local kind=$1 n=$2 coll=$3 file
    [ "$kind" = time ] && file="$work/med_time" || file="$work/med_bw"
    awk -v n="$n" -v c="$coll" -v kind="$kind" '
        $2 == n && $3 == c {
            size = $4; val = $5
            if (!(size in seen)) { seen[size] = 1; sizes[++ns] = size }
            if ($1 ~ /^gloo:/) {
                algo = substr($1, 6)
                better = !(size in gbest) || (kind == "time" ? val < gbest[size] : val > gbest[size])
                if (better) { gbest[size] = val; galgo[size] = algo }
            } else {
                cell[$1, size] = val
            }
        }
        function fmt(v) { return kind == "time" ? sprintf("%.1f", v) : sprintf("%.3f", v) }
        function get(p, s) { return ((p, s) in cell) ? fmt(cell[p, s]) : "-" }
        END {
            # sizes sorted numerically (insertion sort; few rows)
            for (i = 2; i <= ns; i++) { x = sizes[i]; j = i - 1
                while (j >= 1 && sizes[j] + 0 > x + 0) { sizes[j + 1] = sizes[j]; j-- }
                sizes[j + 1] = x }
            for (i = 1; i <= ns; i++) {
                s = sizes[i]
                g = (s in gbest) ? fmt(gbest[s]) " (" galgo[s] ")" : "-"
                gv = (s in gbest) ? fmt(gbest[s]) : "-"
                printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s, get("tutti", s), get("tutti_shm", s),
                       g, get("ompi_tcp", s), get("ompi_sm", s), gv
            }
        }' "$file" >"$work/table.$kind.$n.$coll"
    # plot data: size, tutti tcp, tutti shm, ompi tcp, ompi sm, gloo best ("-": missing)
    cut -f1,2,3,5,6,7 "$work/table.$kind.$n.$coll" >"$work/plot.$kind.$n.$coll"
    while IFS=$'\t' read -r size t ts g ot os _; do
        printf '| %s | %s | %s | %s | %s | %s |\n' "$(human "$size")" "$t" "$ts" "$g" "$ot" "$os"
    done <"$work/table.$kind.$n.$coll"
}

# plot KIND RANKS COLL: a PNG beside the markdown (gnuplot), one line per system.
plot() {
    local kind=$1 n=$2 coll=$3
    local png="$imgdir/$coll-np$n-$kind.png"
    local data="$work/plot.$kind.$n.$coll"
    [ -s "$data" ] || return 1
    [ "$coll" != barrier ] || return 1 # one size (0 B): nothing to draw on a log axis
    local ylabel="busbw (GB/s)" key="top left"
    if [ "$kind" = time ]; then ylabel="time (us)"; fi
    gnuplot <<GP 2>>"$work/gnuplot.log" || return 1
set terminal pngcairo size 800,480 font ",10"
set output "$png"
set title "$coll, $n ranks, loopback: $ylabel"
set logscale x 2
set logscale y 10
set format x "%.0b%BB"
set xlabel "message size"
set ylabel "$ylabel"
set key $key
set grid
set datafile missing "-"
set datafile separator "\t"
plot "$data" using 1:2 with linespoints lw 2 title "tutti tcp", \
     "" using 1:3 with linespoints lw 2 title "tutti shm", \
     "" using 1:6 with linespoints title "gloo best", \
     "" using 1:4 with linespoints title "ompi tcp", \
     "" using 1:5 with linespoints title "ompi sm"
GP
    echo "$(basename "$imgdir")/$(basename "$png")"
}

# summary: one row per (collective, ranks, peer variant).
summary() {
    sort -k3,3 -k2,2n -k1,1 -k4,4n "$work/med_time" | awk -v bwf="$work/med_bw" '
        BEGIN { while ((getline l < bwf) > 0) { split(l, f, " "); bw[f[1], f[2], f[3], f[4]] = f[5] } }
        function flush() {
            if (key == "") return
            b4 = ((p, n, c, 4194304) in bw) ? sprintf("%.3f", bw[p, n, c, 4194304]) : "-"
            bl = (c != "barrier" && (p, n, c, last) in bw) ? sprintf("%.3f", bw[p, n, c, last]) : "-"
            if (c == "barrier") b4 = "-"
            printf "| %s | %s | %s | %.1f | %s | %s |\n", c, n, p, first, b4, bl
        }
        { k = $1 " " $2 " " $3
          if (k != key) { flush(); key = k; p = $1; n = $2; c = $3; first = $5 }
          last = $4 }
        END { flush() }'
}

mkdir -p "$(dirname "$out")"
imgdir="$(dirname "$out")/img"
have_gnuplot=0
if command -v gnuplot >/dev/null; then
    have_gnuplot=1
    mkdir -p "$imgdir"
else
    note "gnuplot not found (apt-get install gnuplot-nox): no plots"
fi
{
    echo "# Benchmarks: tutti vs Gloo vs Open MPI (loopback)"
    echo
    echo "Generated by \`bench/peers/run-peers.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'), host"
    echo "$(uname -n) ($(nproc) cores, $(uname -r)). Sizes $min_b .. $max_b (x$factor), $iters"
    echo "timed + $warmup warmup iterations per size, median of $repeats runs. Every process"
    echo "runs on this one host and talks over loopback (*tutti tcp* and Gloo: TCP on 127.0.0.1;"
    echo "*tutti shm*: tutti's shared-memory transport, \`TUTTI_TRANSPORT=shm\`;"
    echo "Open MPI: \`--mca btl tcp,self --mca btl_tcp_if_include lo\` for *ompi tcp*,"
    echo "\`--mca btl vader,self\` for *ompi sm*, pml ob1, no binding)."
    echo
    echo "Time = mean over iterations of the per-iteration maximum over ranks; busbw = bytes /"
    echo "time x 2(n-1)/n for allreduce, x 1 for broadcast (GB/s = 1e9 B/s). All figures are"
    echo "the in-place half (Gloo collectives are in-place only); float sum. *gloo best* is"
    echo "the best Gloo algorithm for that size (ring, ring_chunked, halving_doubling, bcube"
    echo "for allreduce; broadcast_one_to_all; barrier_all_to_all)."
    if [ -s "$notes" ]; then
        echo
        echo "Notes:"
        echo
        cat "$notes"
    fi
    for coll in $colls; do
        for n in $ranks_list; do
            echo
            echo "## $coll, $n ranks"
            kinds="time"
            [ "$coll" != barrier ] && kinds="bw time"
            for kind in $kinds; do
                echo
                if [ "$kind" = bw ]; then
                    echo "busbw (GB/s), higher is better:"
                else
                    echo "time (us), lower is better:"
                fi
                echo
                echo "| size | tutti tcp | tutti shm | gloo best | ompi tcp | ompi sm |"
                echo "|---:|---:|---:|---:|---:|---:|"
                table "$kind" "$n" "$coll"
                if [ "$have_gnuplot" = 1 ] && img=$(plot "$kind" "$n" "$coll"); then
                    echo
                    echo "![$coll, $n ranks, $kind]($img)"
                fi
            done
        done
    done
    echo
    echo "## Every variant"
    echo
    echo "Medians per peer and algorithm: time of the smallest message, busbw at 4 MiB and"
    echo "at the largest size (barrier: its time)."
    echo
    echo "| collective | ranks | peer | smallest: time (us) | 4 MiB: busbw (GB/s) | largest: busbw (GB/s) |"
    echo "|---|---:|---|---:|---:|---:|"
    summary
} >"$out.tmp" && mv "$out.tmp" "$out"
cat "$out"
echo "run-peers: wrote $out" >&2
