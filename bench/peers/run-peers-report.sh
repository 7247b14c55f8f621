# Sourced by run-peers.sh: from $results (rows of "system ranks coll family size p50 mean
# p99 wrong repeat"), the per-cell medians and ranges over repeats, the ratio tables, the
# per-case tables and the plots, into $out.
# shellcheck shell=bash disable=SC2154 # the variables are run-peers.sh's

# Columns of a family, tutti's first, and their labels.
family_columns() { [ "$1" = tcp ] && echo "tutti_tcp ompi_tcp mpich_tcp gloo" ||
    echo "tutti_shm ompi_vader mpich_shm"; }
label() {
    case $1 in
    tutti_tcp) echo "tutti tcp" ;; tutti_shm) echo "tutti shm" ;;
    ompi_tcp) echo "Open MPI tcp" ;; ompi_vader) echo "Open MPI vader" ;;
    mpich_tcp) echo "MPICH tcp" ;; mpich_shm) echo "MPICH shm" ;; gloo) echo "Gloo" ;;
    esac
}

# cells: "system ranks coll family size median min max repeats algo" per cell: the
# median, min and max over repeats of the per-run p50. The Gloo allreduce algorithms
# collapse into "gloo", the one with the lowest median per size (its name in algo).
cells() {
    # a run whose check failed at a size does not count there (notes list it)
    awk '$9 == "N/A" || $9 == 0' "$results" | sort -k1,1 -k2,2n -k3,3 -k4,4 -k5,5n -k6,6g | awk '
        function flush() {
            if (k == "") return
            split(k, f, " ")
            med = m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
            sys = f[1]; algo = "-"
            if (sys ~ /^gloo:/) { algo = substr(sys, 6); sys = "gloo" }
            key = sys " " f[2] " " f[3] " " f[4] " " f[5]
            if (!(key in best) || med < best[key]) {
                best[key] = med; line[key] = key " " med " " v[1] " " v[m] " " m " " algo
            }
        }
        { key5 = $1 " " $2 " " $3 " " $4 " " $5
          if (key5 != k) { flush(); k = key5; m = 0 }
          v[++m] = $6 }
        END { flush(); for (key in line) print line[key] }' | sort -k1,1 -k2,2n -k3,3 -k5,5n
}

# human_awk: an awk function, human(bytes), "4 B", "16 KiB", "256 MiB" (for human and
# ratio_summary's awk).
human_awk='function human(b,  i) { split("B KiB MiB GiB", hu, " "); i = 1
    while (b >= 1024 && b % 1024 == 0 && i < 4) { b /= 1024; i++ }
    return sprintf("%d %s", b, hu[i]) }'
human() { awk -v b="$1" "$human_awk"' BEGIN { printf "%s", human(b) }'; }

# case_rows RANKS COLL FAMILY KIND: TSV rows of one case: size, per column its median
# (kind time: "med (min-max)" in us; kind bw: busbw GB/s at the median; "-": none), the
# best peer and tutti / best peer (time ratio; busbw ratio is its inverse).
case_rows() {
    awk -v n="$1" -v c="$2" -v fam="$3" -v kind="$4" -v cols="$(family_columns "$3")" '
        BEGIN { nc = split(cols, col, " ")
                fac = c == "allreduce" ? 2 * (n - 1) / n : c == "broadcast" ? 1 : (n - 1) / n }
        $2 == n && $3 == c && $4 == fam {
            if (!($5 in seen)) { seen[$5] = 1; sz[++ns] = $5 }
            med[$1, $5] = $6; lo[$1, $5] = $7; hi[$1, $5] = $8; algo[$1, $5] = $10 }
        function bw(s, t) { return s / 1e3 / t * fac }
        function cell(p, s) {
            if (!((p, s) in med)) return "-"
            a = algo[p, s] != "-" ? " " algo[p, s] : ""
            if (kind == "bw") return sprintf("%.3f%s", bw(s, med[p, s]), a)
            return sprintf("%.1f (%.1f-%.1f)%s", med[p, s], lo[p, s], hi[p, s], a)
        }
        END {
            for (i = 2; i <= ns; i++) { x = sz[i]; j = i - 1
                while (j >= 1 && sz[j] + 0 > x + 0) { sz[j + 1] = sz[j]; j-- }
                sz[j + 1] = x }
            for (i = 1; i <= ns; i++) {
                s = sz[i]; row = s; bp = ""
                for (k = 1; k <= nc; k++) {
                    row = row "\t" cell(col[k], s)
                    if (k > 1 && (col[k], s) in med && (bp == "" || med[col[k], s] < med[bp, s]))
                        bp = col[k]
                }
                r = "-"
                if (bp != "" && (col[1], s) in med) {
                    r = med[col[1], s] / med[bp, s]
                    r = sprintf("%.3g", kind == "bw" ? 1 / r : r)
                }
                print row "\t" (bp == "" ? "-" : bp) "\t" r
            }
        }' "$work/cells"
}

# case_table RANKS COLL FAMILY KIND: the markdown of one case, its plot data on the side.
case_table() {
    local cols hdr="| size |" sep="|---:|" c
    cols=$(family_columns "$3")
    for c in $cols; do hdr="$hdr $(label "$c") |"; sep="$sep---:|"; done
    if [ "$4" = bw ]; then hdr="$hdr best peer | busbw tutti / best |"
    else hdr="$hdr best peer | time tutti / best |"; fi
    echo "$hdr"
    echo "$sep---|---:|"
    case_rows "$@" | tee "$work/plot.$1.$2.$3.$4" | while IFS=$'\t' read -r -a f; do
        local line i
        line="| $(human "${f[0]}") |"
        for ((i = 1; i < ${#f[@]}; i++)); do
            [ "$i" = $((${#f[@]} - 2)) ] && f[i]=$(label "${f[i]}")
            line="$line ${f[i]:--} |"
        done
        echo "$line"
    done
}

# plot RANKS COLL FAMILY KIND: a PNG of the medians (gnuplot), one line per system.
plot() {
    local n=$1 coll=$2 fam=$3 kind=$4 c k=2 spec="" ylabel="busbw (GB/s)"
    local data="$work/plot.$n.$coll.$fam.$kind" png="$imgdir/$coll-np$n-$fam-$kind.png"
    [ "$kind" = time ] && ylabel="p50 time (us)"
    [ -s "$data" ] || return 1
    for c in $(family_columns "$fam"); do
        spec="$spec${spec:+, }\"$data\" using 1:(\$$k) with linespoints lw 2 title \"$(label "$c")\""
        k=$((k + 1))
    done
    gnuplot <<GP 2>>"$work/gnuplot.log" || return 1
set terminal pngcairo size 800,480 font ",10"
set output "$png"
set title "$coll, $n ranks, $fam family, loopback: $ylabel (median of repeats)"
set logscale x 2
set logscale y 10
set format x "%.0b%BB"
set xlabel "size"
set ylabel "$ylabel"
set key top left
set grid
set datafile missing "-"
set datafile separator "\t"
plot $spec
GP
    echo "$(basename "$imgdir")/$(basename "$png")"
}

# paired_rows RANKS COLL FAMILY: TSV rows "size, paired ratio, best peer": the best peer
# is the one with the lowest median (cells); each repeat gives one ratio, tutti's p50 over
# that peer's p50 in the same repeat (the runs alternate, so a pair saw the same state of
# the host); the median of those ratios and their range, "0.9 (0.8-1.1)".
paired_rows() {
    awk -v n="$1" -v c="$2" -v fam="$3" -v cols="$(family_columns "$3")" '
        BEGIN { split(cols, col, " "); me = col[1] }
        FNR == NR {
            if ($2 != n || $3 != c || $4 != fam || $1 == me) next
            if (!($5 in bm) || $6 < bm[$5]) {
                bm[$5] = $6; bp[$5] = $1; bs[$5] = $1 == "gloo" && $10 != "-" ? "gloo:" $10 : $1
            }
            next
        }
        $2 == n && $3 == c && $4 == fam && ($9 == "N/A" || $9 == 0) { t[$1, $5, $10] = $6; sz[$5] = 1; rp[$10] = 1 }
        END {
            for (s in sz) {
                if (!(s in bp)) continue
                m = 0
                for (r in rp)
                    if ((me, s, r) in t && (bs[s], s, r) in t && t[bs[s], s, r] > 0)
                        v[++m] = t[me, s, r] / t[bs[s], s, r]
                if (!m) continue
                for (i = 2; i <= m; i++) { x = v[i]; j = i - 1
                    while (j >= 1 && v[j] > x) { v[j + 1] = v[j]; j-- }
                    v[j + 1] = x }
                med = m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
                printf "%s\t%.3g (%.3g-%.3g) %s\n", s, med, v[1], v[m], bp[s]
            }
        }' "$work/cells" "$results" | sort -k1,1n
}

# ratio_table FAMILY: tutti / best peer per size and case, paired by repeat.
ratio_table() {
    local fam=$1 n coll hdr="| size |" sep="|---:|"
    for coll in $colls; do for n in $ranks_list; do
        hdr="$hdr $coll np$n |"; sep="$sep---:|"
        paired_rows "$n" "$coll" "$fam" | awk -v k="$coll.$n" -F'\t' '{ print $1 "\t" k "\t" $2 }'
    done; done >"$work/ratios.$fam"
    echo "$hdr"
    echo "$sep"
    awk -v cases="$(for coll in $colls; do for n in $ranks_list; do printf '%s.%s ' "$coll" "$n"; done; done)" -F'\t' '
        { v[$1, $2] = $3; if (!($1 in seen)) { seen[$1] = 1; sz[++ns] = $1 } }
        END { nc = split(cases, cs, " ")
              for (i = 2; i <= ns; i++) { x = sz[i]; j = i - 1
                  while (j >= 1 && sz[j] + 0 > x + 0) { sz[j + 1] = sz[j]; j-- }
                  sz[j + 1] = x }
              for (i = 1; i <= ns; i++) { printf "%s", sz[i]
                  for (k = 1; k <= nc; k++) printf "\t%s", ((sz[i], cs[k]) in v) ? v[sz[i], cs[k]] : "-"
                  printf "\n" } }' "$work/ratios.$fam" |
        while IFS=$'\t' read -r -a f; do
            local line i
            line="| $(human "${f[0]}") |"
            for ((i = 1; i < ${#f[@]}; i++)); do line="$line ${f[i]/_/ } |"; done
            echo "$line"
        done
}

# ratio_summary FAMILY: after ratio_table, how many cases are at or below the best peer,
# and the ones above: first those above in every repeat (the lowest paired ratio over 1,
# beyond this host's run-to-run spread), then those above by the median only.
ratio_summary() {
    awk -F'\t' "$human_awk"'
        { split($3, f, " "); r = f[2]; gsub(/[()]/, "", r); split(r, lh, "-")
          n++; if (f[1] + 0 <= 1) { ok++; next }
          c = $2; sub(/\./, " np", c)
          peer = f[3]; gsub(/_/, " ", peer)
          line = sprintf("%s %s %s %s %s", c, human($1), f[1], f[2], peer)
          if (lh[1] + 0 > 1) every[++ne] = line; else some[++ns] = line }
        END {
          printf "\nAt or below the best peer: **%d of %d** cases.\n", ok, n
          printf "- above it in every repeat (the lowest paired ratio over 1): %d", ne
          for (i = 1; i <= ne; i++) printf "%s%s", (i == 1 ? ": " : "; "), every[i]
          printf "\n- above by the median only, repeats either way: %d", ns
          for (i = 1; i <= ns; i++) printf "%s%s", (i == 1 ? ": " : "; "), some[i]
          printf "\n" }' "$work/ratios.$1"
}

report_header() {
    echo "# Benchmarks: tutti vs Open MPI, MPICH and Gloo (loopback)"
    echo
    if [ "${runs:-1}" -gt 1 ]; then
        echo "Generated by \`bench/peers/run-peers.sh\` from $runs runs of one method (started $started;"
        echo "$((${elapsed:-0} / 60)) min in all$([ "${elapsed_unknown:-0}" -gt 0 ] &&
            echo " and $elapsed_unknown stopped before their end"); which run gave which case: the notes),"
    else
        echo "Generated by \`bench/peers/run-peers.sh\` (run started $started, $((${elapsed:-0} / 60)) min),"
    fi
    echo "host $(uname -n) (${cpu:-$(nproc) cores}, $(uname -r)); method: docs/benchmarks-method.md."
    if [ -n "${fault_us_start:-}" ]; then
        echo "A page fault took ${fault_us_start} us before the run and ${fault_us_end:-?} after it (bench/fault-probe.c;"
        echo "a call that maps its scratch afresh pays it per 4 KiB page: 64 MiB is 16384 pages)."
    fi
    echo "Bands (sizes MIN..MAX x4 : timed : warm-up iterations): \`$bands\`; $repeats interleaved"
    echo "repeats; ranks $ranks_list; check ${check:-off}; fresh input ${fresh:-off} (on: each rank"
    echo "rewrote its input before each timed call, then $([ -n "${window:-}" ] && echo "waited for the call's start, one instant on every rank (--window)" || echo "a barrier")); ranks bound to CPUs:"
    echo "$([ "${bind:-0}" = 1 ] && echo "every system's, one CPU a rank, rank i of N on CPU i*C/N" || echo "no system's"); root of the rooted"
    echo "collectives: $([ "${root_of:-0}" = last ] && echo "rank N-1" || echo "rank ${root_of:-0}"). Each figure is the median"
    echo "over the repeats of a run's p50 (over iterations) of the per-iteration maximum over ranks$([ -n "${window:-}" ] && echo " (each rank's time from the common start)"), with the"
    echo "range over repeats in parentheses; busbw = size / that time x the nccl-tests factor"
    echo "(2(n-1)/n allreduce, 1 broadcast and neighbor_alltoall, (n-1)/n allgather, reduce_scatter, alltoall)."
    echo "In-place half for allreduce, broadcast and reduce_scatter, out-of-place half for"
    echo "allgather, alltoall and neighbor_alltoall: a form every system has natively."
    echo "Gloo allreduce: the fastest of ring, ring_chunked, halving_doubling, bcube per size."
    if [ -s "$work/window" ]; then
        echo "Timed calls left out because a rank reached the call after its start (--window):"
        awk '{ l[$1] += $2; t[$1] += $3 } END { for (s in l) print s, l[s], t[s] }' "$work/window" |
            sort | awk '{ printf "%s%s %d of %d", (NR > 1 ? "; " : ""), $1, $2, $3 } END { print "." }'
        if awk 'NF >= 5 && $4 != "-" { found = 1 } END { exit !found }' "$work/window"; then
            echo "Halves whose ranks slept between timed calls (a median warm-up call of 250 us or more):"
            awk 'NF >= 5 && $4 != "-" { s[$1] += $4; h[$1] += $5 } END { for (x in s) print x, s[x], h[x] }' \
                "$work/window" |
                sort | awk '{ printf "%s%s %d of %d", (NR > 1 ? "; " : ""), $1, $2, $3 } END { print "." }'
        fi
    fi
    if [ -s "$notes" ]; then echo; echo "Notes:"; echo; cat "$notes"; fi
}

report() {
    cells >"$work/cells"
    # shellcheck source=/dev/null
    [ -n "${started:-}" ] || . "$work/meta"
    mkdir -p "$(dirname "$out")"
    imgdir="$(dirname "$out")/img"
    local have_gnuplot=0 fam coll n kind img
    if command -v gnuplot >/dev/null; then have_gnuplot=1; mkdir -p "$imgdir"
    else note "gnuplot not found (apt-get install gnuplot-nox): no plots"; fi
    {
        report_header
        for fam in $transports; do
            echo
            echo "## Ratios, $fam family: time tutti / best peer (< 1: tutti faster)"
            echo
            echo "Per repeat, tutti's p50 over the best peer's (the lowest median) in the same"
            echo "repeat; the median of those ratios, their range in parentheses."
            echo
            ratio_table "$fam"
            ratio_summary "$fam"
        done
        for coll in $colls; do for n in $ranks_list; do for fam in $transports; do
            echo
            echo "## $coll, $n ranks, $fam"
            for kind in time bw; do
                echo
                [ "$kind" = time ] && echo "p50 time (us), median (min-max over repeats), lower is better:" ||
                    echo "busbw (GB/s) at the median time, higher is better:"
                echo
                case_table "$n" "$coll" "$fam" "$kind"
                if [ "$have_gnuplot" = 1 ] && img=$(plot "$n" "$coll" "$fam" "$kind"); then
                    echo
                    echo "![$coll, $n ranks, $fam, $kind]($img)"
                fi
            done
        done; done; done
    } >"$out.tmp" && mv "$out.tmp" "$out"
    cat "$out"
    echo "run-peers: wrote $out" >&2
}
