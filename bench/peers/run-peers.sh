#!/usr/bin/env bash
# run-peers.sh: tutti against Open MPI, MPICH and Gloo on this host, loopback only, by one
# method (docs/benchmarks-method.md): tutti-bench, mpi-bench (built twice, with
# mpicc.openmpi and mpicc.mpich) and gloo-bench share the iteration structure, inputs,
# sizes and statistic (per-iteration max over ranks, p50 over iterations). For each
# (ranks, collective, transport family) the systems run interleaved, A B C then C B A,
# R times; a cell is the median over the repeats of the per-run p50, with the range
# (min-max over repeats) beside it. Writes markdown (ratio tables, per-case tables) and
# gnuplot PNGs to the -o file and an img/ folder beside it.
#
#   bench/peers/run-peers.sh [--quick | --big] [-R REPEATS] [--ranks "2 4"]
#        [--colls "..."] [--transports "tcp shm"] [--bands "MIN:MAX:ITERS:WARMUP ..."]
#        [--check] [--fresh] [--barriers] [--bind] [--root R|last] [--peers LIST] [--build DIR] [-o FILE]
#        [--keep] [--from DIR [--from DIR ...]] [--estimate] [--run-timeout S]
#
# A peer that is missing is skipped with a note; a run that fails is noted and the others
# go on; a system that hangs twice at a rank count is dropped there for the rest of the run.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

out="$root/docs/benchmarks-latest.md"
repeats=5
ranks_list="2 4"
colls="allreduce broadcast allgather reduce_scatter alltoall"
colls_all="$colls barrier reduce gather scatter scan exscan neighbor_alltoall" # merged runs' order
transports="tcp shm"
# Iterations by size, so that a full run stays under ~40 minutes on a 2-core VM: one
# process per band, each band MIN..MAX by x4 with its timed and warm-up iterations.
bands_std="4:64K:100:10 256K:4M:30:5 16M:64M:8:2"
bands_big="4:64K:100:10 256K:4M:20:3 16M:64M:6:1 256M:256M:3:1"
bands_quick="4:4:20:3 64K:64K:20:3 4M:4M:10:2 64M:64M:4:1"
bands=$bands_std
mode=std
check=""
fresh=""
window="--window"
bind=0
root_of="0"
build=""
keep=0
keep_asked=0
from=""
froms=()
estimate=0
peers="tutti ompi mpich gloo"
run_timeout=300
exit_grace=${RUN_PEERS_EXIT_GRACE:-10}
ranks_set=0

usage() {
    sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    cat <<EOF
Options:
  --quick          smoke test: sizes 4, 64K, 4M, 64M, 2 ranks, few iterations
  --big            sizes 4 .. 256M (default 4 .. 64M), x4
  -R REPEATS       interleaved repeats per case (default 5)
  --ranks LIST     rank counts (default "2 4"; --quick: "2")
  --colls LIST     collectives (default "$colls"; barrier also works, and scan, exscan
                   and neighbor_alltoall against the MPIs only)
  --transports L   families: tcp (tutti tcp, Open MPI tcp, MPICH tcp, Gloo) and/or shm
                   (tutti shm, Open MPI vader, MPICH shm) (default "tcp shm")
  --bands LIST     MIN:MAX:ITERS:WARMUP per band, sizes MIN..MAX x4
                   (default "$bands_std")
  --check          every harness verifies its results (-c) against its own reference
  --fresh          every harness rewrites its input before each timed call (untimed,
                   then a barrier): the data moved was just written by its own rank,
                   not left clean in the peers' caches by the previous call
  --window         the default: every harness starts timed call i on every rank at one
                   instant of the host's clock and times it from there (--window;
                   bench/stats.h), not from each rank's exit from the barrier before
                   it: no system's barrier exit order (see --root) enters its times
  --barriers       the method before session 59: each rank times a call from its own
                   exit from a barrier (with --fresh, the barrier after its refill)
  --bind           every system holds each rank on one CPU, rank i of N on the
                   (i*C/N)-th of C (tutti-bench and gloo-bench --bind, Open MPI
                   --bind-to core:overload-allowed, MPICH -bind-to core); default:
                   every system unbound (Open MPI --bind-to none)
  --root R|last    root of the rooted collectives (broadcast, reduce, gather, scatter)
                   in every harness (default 0; last: rank N-1 at each rank count).
                   With --fresh a rooted call starts as the barrier before it lets each
                   rank go, so a system whose barrier lets rank 0 go first looks faster
                   with root 0 than with root N-1 (docs/benchmarks.md, session 47)
  --peers LIST     which systems (default "$peers")
  --build DIR      meson build dir with bench/tutti-bench (default build-bench, then build)
  -o FILE          markdown output (default docs/benchmarks-latest.md)
  --keep           keep the raw outputs (their dir is printed)
  --from DIR       run nothing: rebuild the tables from the raw outputs kept in DIR.
                   Given more than once, one report of several runs of one method (the
                   same plan but for its ranks, collectives and families; else an
                   error); a case (ranks, collective, family) in more than one is taken
                   from the last given, and the report's notes say which run gave which
  --estimate       print the plan and a rough duration, run nothing
  --run-timeout S  kill one band's run after S seconds, noted as failed (default 300:
                   a band takes 1-2 min here; a hung peer no longer costs 15); a system
                   killed twice at one rank count is not run again at it in this run
                   (noted), so that one run of every case finishes. A band above 64 MiB
                   gets S x its largest size / 64 MiB (256 MiB: 4 S). A run that printed
                   its last line (with --window, "# Window:") and has not exited 10 s
                   later (RUN_PEERS_EXIT_GRACE) is stopped, its rows kept, not counted
EOF
}

while [ $# -gt 0 ]; do
    case "$1" in
    -o) out=$2; shift ;;
    -R | --repeats) repeats=$2; shift ;;
    --ranks) ranks_list=$2; ranks_set=1; shift ;;
    --colls) colls=$2; shift ;;
    --transports) transports=$2; shift ;;
    --quick) mode=quick; bands=$bands_quick ;;
    --big) mode=big; bands=$bands_big ;;
    --bands) bands=$2; mode=custom; shift ;;
    --check) check="-c" ;;
    --fresh) fresh="--fresh" ;;
    --window) window="--window" ;;
    --barriers) window="" ;;
    --bind) bind=1 ;;
    --root) root_of=$2; shift ;;
    --build) build=$2; shift ;;
    --peers) peers=$2; shift ;;
    --keep) keep=1; keep_asked=1 ;;
    --from) from=$2; froms+=("$2"); keep=1; shift ;;
    --estimate) estimate=1 ;;
    --run-timeout) run_timeout=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run-peers.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
if [ "$mode" = quick ] && [ "$ranks_set" = 0 ]; then ranks_list=2; fi

# --- the systems ------------------------------------------------------------------
# family_systems FAMILY COLL: the systems compared in a family, tutti's first.
family_systems() {
    local s=""
    wants tutti && s="tutti_$1"
    if [ "$1" = tcp ]; then
        wants ompi && s="$s ompi_tcp"
        wants mpich && s="$s mpich_tcp"
        if wants gloo && ! gloo_lacks "$2"; then
            if [ "$2" = allreduce ]; then
                s="$s gloo:ring gloo:ring_chunked gloo:halving_doubling gloo:bcube"
            else
                s="$s gloo"
            fi
        fi
    else
        wants ompi && s="$s ompi_vader"
        wants mpich && s="$s mpich_shm"
    fi
    echo "$s"
}
wants() { case " $peers " in *" $1 "*) return 0 ;; esac; return 1; }
# the collectives Gloo has none of (gloo-bench refuses them): Gloo is left out of theirs
gloo_lacks() { case $1 in scan | exscan | neighbor_alltoall) return 0 ;; esac; return 1; }

# The half a table shows: a form native to every system (Gloo's allreduce, broadcast and
# reduce_scatter are in place only, its alltoall out of place only, its in-place allgather
# stalls); barrier, neighbor_alltoall (no in-place form, in MPI neither): its one.
half_of() { case $1 in allgather | alltoall | barrier | neighbor_alltoall) echo oop ;; *) echo ip ;; esac; }

# band_sizes MIN MAX: the sizes of a band in bytes.
to_bytes() {
    local v=${1%[bB]} m=1
    case $v in *[kK]) m=1024; v=${v%?} ;; *[mM]) m=1048576; v=${v%?} ;; *[gG]) m=1073741824; v=${v%?} ;; esac
    echo $((v * m))
}
band_sizes() {
    local s e
    s=$(to_bytes "$1") e=$(to_bytes "$2")
    while [ "$s" -le "$e" ]; do echo "$s"; s=$((s * 4)); done
}

# --- estimate ---------------------------------------------------------------------
# Rough: per process 0.5 s to start and meet; per call 60 us plus the bytes a rank moves
# (2x for allreduce) at 1 GB/s; two halves per size; 4 ranks ~2x (fitted to a --quick
# run on a 2-core VM under load: 3.7 min for 304 processes).
estimate_s() {
    local nsys=0 nruns=0 sec=0 n coll fam b
    for n in $ranks_list; do for coll in $colls; do for fam in $transports; do
        nsys=$(family_systems "$fam" "$coll" | wc -w)
        for b in $bands; do
            IFS=: read -r bmin bmax it wu <<<"$b"
            nruns=$((nruns + nsys * repeats))
            sec=$(band_sizes "$bmin" "$bmax" | awk -v it="$it" -v wu="$wu" -v n="$n" \
                -v c="$coll" -v k="$nsys" -v r="$repeats" -v acc="$sec" '
                { mul = (c == "allreduce" ? 2 : 1) * (n > 2 ? 2 : 1)
                  t += 2 * (it + wu + 1) * (60e-6 + $1 * mul / 1e9) }
                END { printf "%d", acc + (t + 0.5) * k * r }')
        done
    done; done; done
    echo "$nruns $sec"
}
if [ "$estimate" = 1 ]; then
    read -r nruns sec < <(estimate_s)
    echo "plan: ranks [$ranks_list], colls [$colls], transports [$transports], bands [$bands]," \
        "$repeats repeats: $nruns processes, about $((sec / 60)) min (rough model)"
    exit 0
fi

# meta_get DIR VAR: VAR as DIR's meta sets it ("" when it sets none).
meta_get() { (
    # shellcheck disable=SC2030,SC2034 # a subshell's own, read through ${!2}
    window="" started="" elapsed="" cpu="" fault_us_start="" fault_us_end=""
    # shellcheck source=/dev/null
    . "$1/meta" && printf '%s' "${!2:-}"
); }

# A plan's fields but its cases (ranks, collectives, families): runs merged must agree.
method_fields="repeats bands mode check fresh window bind root_of peers"

# merge_runs INTO DIR...: the kept outputs of several runs as one run's in INTO (meta,
# results, window, notes), for one report. Every plan field but the cases must match
# (one method); each case (ranks, collective, family) comes from the last run that has
# it; ranks, collectives and families are those of the rows taken.
merge_runs() {
    local into=$1 d v a b k=0 started_all="" cpus="" el=0 unknown=0 rev=()
    shift
    for d in "$@"; do rev=("$d/results" "${rev[@]}"); done
    for d in "$@"; do
        if [ ! -f "$d/results" ] || [ ! -f "$d/meta" ]; then
            echo "run-peers.sh: no results/meta in $d" >&2
            return 1
        fi
        for v in $method_fields; do
            a=$(meta_get "$1" "$v") b=$(meta_get "$d" "$v")
            if [ "$a" != "$b" ]; then
                echo "run-peers.sh: $d ran another method than $1 ($v: '$b' against '$a'): not merged" >&2
                return 1
            fi
        done
    done
    # last run first: a case is taken from the first file (the last run) that has it
    awk -v nruns=$# '
        FNR == 1 { for (c in cur) taken[c] = run; delete cur
                   for (i = 1; i < ARGC; i++) if (ARGV[i] == FILENAME) run = nruns + 1 - i }
        { c = $2 " " $3 " " $4
          if (c in taken) { if (!((run, c) in said)) { said[run, c] = 1
              print run, "also", c, taken[c] > "/dev/stderr" }; next }
          cur[c] = 1; print >"/dev/stdout"
          if (!((run, c) in told)) { told[run, c] = 1; print run, "took", c > "/dev/stderr" } }
        ' "${rev[@]}" >"$into/results" 2>"$into/cases"
    : >"$into/notes"
    for d in "$@"; do
        k=$((k + 1))
        a=$(meta_get "$d" started) b=$(meta_get "$d" elapsed)
        started_all="${started_all:+$started_all; }$a"
        el=$((el + ${b:-0}))
        [ -n "$b" ] || unknown=$((unknown + 1))
        v=$(meta_get "$d" cpu)
        case "; $cpus; " in *"; $v; "*) ;; *) cpus="${cpus:+$cpus; }$v" ;; esac
        {
            v=$(meta_get "$d" fault_us_start) w=$(meta_get "$d" fault_us_end) # w: none if stopped
            printf -- '- run %d (%s, started %s, %s%s%s): ' "$k" "$d" "$a" \
                "$([ -n "$b" ] && echo "$((b / 60)) min" || echo "stopped before its end")" \
                "${v:+; a page fault ${v} us before it}" "${v:+${w:+, $w after}}"
            awk -v k="$k" '$1 == k && $2 == "took" { printf "%s%s np=%s %s", (n++ ? ", " : ""), $4, $3, $5 }
                END { if (!n) printf "no case" }' "$into/cases"
            echo
            awk -v k="$k" '$1 == k && $2 == "also" {
                printf "- run %d also measured %s np=%s %s: taken from run %d\n", k, $4, $3, $5, $6 }' \
                "$into/cases"
            grep -v 'gnuplot not found' "$d/notes" | sed "s/^- /- [run $k] /" # said again below
        } >>"$into/notes"
        # the late calls of the cases this run's rows were taken for (rows that name
        # their case, since session 73; older rows name none and all count)
        [ -f "$d/window" ] && awk -v k="$k" 'FNR == NR { if ($1 == k && $2 == "took")
                took[$3 " " $4 " " $5] = 1; next }
            NF < 8 || (($6 " " $7 " " $8) in took)' "$into/cases" "$d/window" >>"$into/window"
    done
    {
        for v in $method_fields; do
            printf '%s=%q\n' "$v" "$(meta_get "$1" "$v")"
        done
        printf 'ranks_list=%q\n' "$(awk '{ print $2 }' "$into/results" | sort -nu | xargs)"
        printf 'colls=%q\n' "$(for v in $colls_all; do
            awk -v c="$v" '$3 == c { print c; exit }' "$into/results"; done | xargs)"
        printf 'transports=%q\n' "$(for v in tcp shm; do
            awk -v f="$v" '$4 == f { print f; exit }' "$into/results"; done | xargs)"
        printf 'started=%q\n' "$started_all"
        printf 'elapsed=%q\n' "$el"
        printf 'cpu=%q\n' "$cpus"
        printf 'runs=%q\n' "$#"
        printf 'elapsed_unknown=%q\n' "$unknown"
    } >"$into/meta"
}

# --- work dir ---------------------------------------------------------------------
if [ "${#froms[@]}" -gt 1 ]; then
    work=$(mktemp -d /tmp/run-peers.XXXXXX) || exit 1
    merge_runs "$work" "${froms[@]}" || { rm -rf "$work"; exit 2; }
    keep=$keep_asked
fi
if [ -n "$from" ]; then
    [ "${#froms[@]}" -gt 1 ] || work=$from
    if [ ! -f "$work/results" ] || [ ! -f "$work/meta" ]; then
        echo "run-peers.sh: no results/meta in $work" >&2
        exit 2
    fi
    window="" # a run from before session 58 had no --window, and its meta no line for it
    # shellcheck source=/dev/null
    . "$work/meta" # the plan of that run
else
    work=$(mktemp -d /tmp/run-peers.XXXXXX) || exit 1
fi
# Only the script's own shell cleans up: a forked child that runs the trap (bash does,
# for a child signalled between its fork and its exec) must not remove the work dir.
main_pid=$BASHPID
cleanup() {
    [ "$BASHPID" = "$main_pid" ] || return 0
    if [ "$keep" = 1 ]; then echo "raw outputs kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
# Interrupted (Ctrl-C, or a TERM from a job's limit): the band's run in progress is a
# background job (run_one), which a non-interactive shell starts with SIGINT ignored and
# timeout puts in a process group of its own, so nothing else would stop it. Its timeout
# passes the TERM on to its group and kills what is left 10 s later. The raw outputs are
# kept either way (what was measured can still be reported with --from).
run_pid=""
interrupted() { # SIGNAL NUMBER
    [ "$BASHPID" = "$main_pid" ] || exit 1
    trap - INT TERM
    if [ -n "$run_pid" ] && kill -0 "$run_pid" 2>/dev/null; then
        kill -TERM "$run_pid" 2>/dev/null
        wait "$run_pid" 2>/dev/null
    fi
    keep=1
    echo "run-peers: interrupted (SIG$1); to report what was measured: $0 --from $work" >&2
    exit $((128 + $2))
}
trap 'interrupted INT 2' INT
trap 'interrupted TERM 15' TERM
notes="$work/notes"
results="$work/results"
note() { echo "- $*" >>"$notes"; echo "run-peers: $*" >&2; }

# shellcheck source=bench/peers/run-peers-measure.sh
. "$here/run-peers-measure.sh"
# shellcheck source=bench/peers/run-peers-report.sh
. "$here/run-peers-report.sh"

if [ -z "$from" ]; then
    : >"$notes"
    : >"$results"
    {
        for v in repeats ranks_list colls transports bands mode check fresh window bind root_of peers; do
            printf '%s=%q\n' "$v" "${!v}"
        done
        printf 'started=%q\n' "$(date -u '+%Y-%m-%d %H:%M UTC')"
        # the machine: these VMs move between hosts from one session to the next
        printf 'cpu=%q\n' "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1) x $(nproc)"
    } >"$work/meta"
    find_binaries
    echo "fault_us_start=$(fault_cost)" >>"$work/meta"
    t0=$(date +%s)
    measure
    echo "elapsed=$(($(date +%s) - t0))" >>"$work/meta"
    echo "fault_us_end=$(fault_cost)" >>"$work/meta"
fi
report
