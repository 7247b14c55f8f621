# Sourced by run-peers.sh: find or build the harnesses, then run every case interleaved,
# appending "system ranks coll family size p50 mean p99 wrong repeat" rows to $results
# (the half half_of picks) and each process's output to $work.
# shellcheck shell=bash disable=SC2154,SC2034,SC2054
# (SC2154: run-peers.sh's variables; SC2034: the *_args arrays are read through a
# nameref; SC2054: commas inside MCA values)

# Open MPI: the ob1 PML and its byte-transfer layers named explicitly, out-of-band on lo.
ompi_args=(--oversubscribe --mca pml ob1 --mca oob_tcp_if_include lo) # + cmd_of's binding
[ "$(id -u)" = 0 ] && ompi_args+=(--allow-run-as-root)
ompi_tcp_args=(--mca btl tcp,self --mca btl_tcp_if_include lo)
ompi_vader_args=(--mca btl vader,self)
# MPICH (ch4): MPIR_CVAR_NOLOCAL=1 treats every rank as remote, so nothing goes through
# its shared memory, and UCX is held to TCP on lo (checked: the ranks hold TCP
# connections on 127.0.0.1 and map no /dev/shm or SysV segment).
mpich_tcp_env=(MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self UCX_NET_DEVICES=lo)

# fault_cost: the median microseconds a page fault takes here (bench/fault-probe.c, built
# by meson or by hand), or nothing. A peer that maps its scratch afresh on each call pays
# it per 4 KiB page, and it differs tenfold between the VMs this has run on.
fault_cost() {
    local probe="$build/bench/fault-probe"
    if [ ! -x "$probe" ]; then
        probe="$work/fault-probe"
        [ -x "$probe" ] || cc -O2 -o "$probe" "$root/bench/fault-probe.c" 2>/dev/null || return 0
    fi
    "$probe" 16 3 2>/dev/null
}

find_binaries() {
    if [ -z "$build" ]; then
        for d in build-bench build; do
            if [ -x "$root/$d/bench/tutti-bench" ]; then build="$root/$d"; break; fi
        done
    fi
    tutti_bin="" gloo_bin="" ompi_bin="" mpich_bin=""
    if wants tutti; then
        if [ -n "$build" ] && [ -x "$build/bench/tutti-bench" ]; then
            tutti_bin="$build/bench/tutti-bench"
        else
            note "tutti-bench not built (meson setup build-bench && ninja -C build-bench): skipped"
        fi
    fi
    if wants gloo; then
        if [ -n "$build" ] && [ -x "$build/bench/peers/gloo-bench" ]; then
            gloo_bin="$build/bench/peers/gloo-bench"
        elif command -v g++ >/dev/null && [ -f /usr/include/gloo/allgather.h ]; then
            # Not built by meson (e.g. -Dpeers=disabled): build it by hand.
            if g++ -std=c++17 -O2 -o "$work/gloo-bench" "$here/gloo_bench.cc" -lgloo \
                -lpthread 2>"$work/gloo-build.log"; then
                gloo_bin="$work/gloo-bench"
            else
                note "gloo-bench failed to build ($(head -c 300 "$work/gloo-build.log")): skipped"
            fi
        else
            note "Gloo not found (needs libgloo-dev and g++): skipped"
        fi
    fi
    local v
    for v in openmpi mpich; do
        local name=${v/openmpi/ompi}
        wants "$name" || continue
        if command -v "mpicc.$v" >/dev/null && command -v "mpirun.$v" >/dev/null; then
            if "mpicc.$v" -O2 -std=gnu11 -o "$work/mpi-bench-$v" "$here/mpi_bench.c" -lm \
                2>"$work/mpi-build-$v.log"; then
                printf -v "${name}_bin" '%s' "$work/mpi-bench-$v"
            else
                note "mpi-bench ($v) failed to build ($(head -c 300 "$work/mpi-build-$v.log")): skipped"
            fi
        else
            note "mpicc.$v/mpirun.$v not found (apt-get install lib$v-dev): $name skipped"
        fi
    done
}

# cmd_of SYSTEM RANKS COLL: the command line of a system, less the size flags, into the
# array cmd; empty when the system is missing.
cmd_of() {
    local sys=$1 n=$2 coll=$3
    cmd=()
    # --bind: every system's ranks each held on one CPU, or none (the default)
    local -a tb=() ob=(--bind-to none) mb=()
    if [ "${bind:-0}" = 1 ]; then
        tb=(--bind)
        ob=(--bind-to core:overload-allowed)
        mb=(-bind-to core)
    fi
    case $sys in
    tutti_*)
        [ -n "$tutti_bin" ] || return 0
        cmd=(env "TUTTI_TRANSPORT=${sys#tutti_}" "$tutti_bin" -np "$n" "${tb[@]}") ;;
    ompi_*)
        [ -n "$ompi_bin" ] || return 0
        local -n extra="${sys}_args"
        cmd=(mpirun.openmpi "${ompi_args[@]}" "${ob[@]}" -np "$n" "${extra[@]}" "$ompi_bin") ;;
    mpich_tcp)
        [ -n "$mpich_bin" ] || return 0
        cmd=(env "${mpich_tcp_env[@]}" mpiexec.mpich "${mb[@]}" -np "$n" "$mpich_bin") ;;
    mpich_shm)
        [ -n "$mpich_bin" ] || return 0
        cmd=(mpiexec.mpich "${mb[@]}" -np "$n" "$mpich_bin") ;;
    gloo*)
        [ -n "$gloo_bin" ] || return 0
        cmd=("$gloo_bin" -np "$n" "${tb[@]}")
        [ "$sys" = gloo ] || cmd+=(--algo "${sys#gloo:}") ;;
    esac
    cmd+=(--coll "$coll")
    case $coll in
    broadcast | reduce | gather | scatter)
        cmd+=(-r "$([ "${root_of:-0}" = last ] && echo $((n - 1)) || echo "${root_of:-0}")") ;;
    esac
}

# run_one SYSTEM RANKS COLL FAMILY REPEAT BAND: one process, its rows into $results.
run_one() {
    local sys=$1 n=$2 coll=$3 fam=$4 rep=$5 band=$6 bmin bmax it wu
    IFS=: read -r bmin bmax it wu <<<"$band"
    cmd_of "$sys" "$n" "$coll"
    [ "${#cmd[@]}" -gt 1 ] || return 0
    # Gloo's alltoall (its unbound-buffer API) takes 0.5 to 2 s at 4 MiB here: not above.
    if [ "$sys" = gloo ] && [ "$coll" = alltoall ] && [ "$(to_bytes "$bmin")" -gt 4194304 ]; then
        grep -q "gloo alltoall" "$notes" ||
            note "gloo alltoall is not run above 4 MiB (0.5 to 2 s a call at 4 MiB on this host)"
        return 0
    fi
    # A system that hung twice at this rank count is not run there again in this run:
    # MPICH's tcp at 4 ranks here hangs on most cases, and each hang costs run_timeout.
    local hkey="${sys/:/-}_np$n"
    if [ "${hangs[$hkey]:-0}" -ge 2 ]; then
        grep -q "^- $sys np=$n hung twice" "$notes" ||
            note "$sys np=$n hung twice (killed at ${run_timeout} s): not run again at $n ranks in this run"
        return 0
    fi
    local log="$work/${sys/:/-}.$coll.np$n.$fam.b$bmin.r$rep.txt" rc=0
    echo "run-peers: $sys $coll np=$n $bmin..$bmax repeat $rep" >&2
    # The limit grows with the band above 64 MiB: at 256 MiB one call of Open MPI's
    # 4-rank tcp allreduce took 2.3-3.2 s here (session 68), and the window's gap is
    # twice the slowest warm-up call, so its ten calls took over 120 s without hanging.
    local limit=$run_timeout big
    big=$(($(to_bytes "$bmax") / 67108864))
    [ "$big" -gt 1 ] && limit=$((run_timeout * big))
    # shellcheck disable=SC2086 # check is -c or nothing, fresh --fresh or nothing, window
    timeout -k 10 "$limit" "${cmd[@]}" -b "$bmin" -e "$bmax" -f 4 -n "$it" -w "$wu" $check $fresh ${window:-} \
        >"$log" 2>&1 &
    local pid=$! done_at=""
    run_pid=$pid # stopped by run-peers.sh's interrupted()
    # With --window every harness's last line is "# Window: ...": a run that printed it
    # and has not exited exit_grace seconds later hangs in its teardown (MPICH's at 4
    # ranks over tcp, session 68): it is stopped, its rows kept, and it is not counted
    # as a hang. Polled 5 times a second with a plain sleep: a background sleep killed
    # once the run ended could be hit after bash forked it and before it ran sleep, and
    # that child then ran this script's EXIT trap, which removed the raw outputs
    # mid-run (session 69; bash 5.2). -s: the log may not exist yet when first polled.
    while [ -n "${window:-}" ] && kill -0 "$pid" 2>/dev/null; do
        if [ -z "$done_at" ] && grep -qs '^# Window:' "$log"; then
            done_at=$SECONDS
        elif [ -n "$done_at" ] && [ $((SECONDS - done_at)) -ge "$exit_grace" ]; then
            kill -TERM "$pid" 2>/dev/null
            note "$sys $coll np=$n $bmin..$bmax repeat $rep printed its last line but had not exited ${exit_grace} s later: stopped, its rows kept"
            done_at=stopped
            break
        fi
        sleep 0.2
    done
    wait "$pid" || rc=$?
    run_pid=""
    [ "$done_at" = stopped ] && rc=0
    if [ "$rc" != 0 ]; then
        note "$sys $coll np=$n $bmin..$bmax repeat $rep failed (rc $rc): $(grep -v '^#' "$log" |
            grep -v '^ *[0-9]' | tail -n 2 | tr '\n' ' ' | head -c 300)"
        # timeout's 124, or 137 when its TERM was not enough
        [ "$rc" = 124 ] || [ "$rc" = 137 ] && hangs[$hkey]=$((${hangs[$hkey]:-0} + 1))
    fi
    # Data rows: size count type redop root, then out-of-place and in-place halves of
    # time algbw busbw #wrong p50 p99 (tutti-bench's barrier rows have the one half).
    awk -v s="$sys" -v n="$n" -v c="$coll" -v f="$fam" -v r="$rep" -v h="$(half_of "$coll")" '
        $1 ~ /^[0-9]+$/ && NF >= (h == "ip" ? 17 : 11) {
            o = h == "ip" ? 6 : 0
            print s, n, c, f, $1, $(10 + o), $(6 + o), $(11 + o), $(9 + o), r }' \
        "$log" >>"$results"
    # --window: the calls a late rank left out ("# Window: L of T timed calls ..."), and
    # the halves whose ranks slept between calls ("- -": not said), then the case (so that
    # a merge counts only the runs' rows of the cases it takes)
    [ -n "${window:-}" ] && awk -v s="$sys" -v n="$n" -v c="$coll" -v f="$fam" '/^# Window:/ {
        slept = $(NF - 1) == "between" ? $(NF - 6) " " $(NF - 4) : "- -"
        print s, $3, $5, slept, n, c, f }' \
        "$log" >>"$work/window"
    return 0
}

# Every case: per (ranks, coll, family) the systems in order, then reversed, R times.
measure() {
    local n coll fam rep sys band systems order
    declare -gA hangs=() # hung runs per system and rank count (run_one)
    for n in $ranks_list; do
        for coll in $colls; do
            for fam in $transports; do
                systems=$(family_systems "$fam" "$coll")
                for rep in $(seq 1 "$repeats"); do
                    order=$systems
                    [ $((rep % 2)) = 0 ] && order=$(echo "$systems" | tr ' ' '\n' | tac | tr '\n' ' ')
                    for sys in $order; do
                        for band in $bands; do
                            run_one "$sys" "$n" "$coll" "$fam" "$rep" "$band"
                        done
                    done
                done
            done
        done
    done
    awk '$9 != "N/A" && $9 > 0 { print "- " $1 " " $3 " np=" $2 " " $5 " B repeat " $10 ": " $9 " wrong values" }' \
        "$results" >>"$notes"
}
