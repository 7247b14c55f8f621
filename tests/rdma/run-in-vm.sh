#!/bin/bash
# Run host-built programs inside a throw-away QEMU guest (Debian 12's own kernel and a
# busybox initramfs) that has a soft-RoCE (rdma_rxe) device, on a host whose kernel has
# no RDMA. The exit status of the guest's command is this script's.
#
# usage: tests/rdma/run-in-vm.sh [-f FILE]... [-t SECS] [-b] [--] [COMMAND [ARG...]]
#   COMMAND  a host file (copied in with its shared libraries, found by ldd) or a
#            command that exists in the guest (ibv_devinfo, sh -c '...').
#            Default: ibv_devinfo -v.
#   -f FILE  host file or directory copied to /payload/<basename> (ELF files found in it
#            bring their shared libraries); repeatable
#   -t SECS  wall-clock limit for the whole VM (default 600)
#   -b       only fetch the guest packages and build the cached base initramfs
# The guest runs COMMAND in /payload with RXE_DEV=rxe0, RXE_IP and RXE_GID_INDEX (the
# RoCE v2 IPv4-mapped GID) set.
#
# Host packages needed: qemu-system-x86 busybox-static cpio kmod (run.sh installs them);
# guest packages come by `apt-get download` once and are cached outside the clone in
# $TUTTI_RXE_CACHE (default /var/cache/tutti-rxe), so reruns fetch nothing.
# Env: VM_MEM (MiB, default 2048), VM_SMP (default: host CPUs, at most 4),
#      TUTTI_RXE_LOG (serial log file, default $TUTTI_RXE_CACHE/last-run.log).
#
# Why TCG and not KVM: where /dev/kvm exists here it is a software-nesting KVM that hangs
# a stock kernel; KVM is used only with kvm_intel/kvm_amd loaded. Networking: the guest's
# NIC sits on an isolated qemu hub with no other port, so no packet leaves the guest.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WORK=${TUTTI_RXE_CACHE:-/var/cache/tutti-rxe}
TIMEOUT=600
EXTRA=()
BUILD_ONLY=
ncpu=$(nproc 2>/dev/null || echo 2)
VM_MEM=${VM_MEM:-2048}
VM_SMP=${VM_SMP:-$((ncpu > 4 ? 4 : ncpu))}
while getopts "f:t:bh" o; do
    case $o in
    f) EXTRA+=("$OPTARG") ;;
    t) TIMEOUT=$OPTARG ;;
    b) BUILD_ONLY=1 ;;
    *) sed -n '2,22p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))

ts() { date +%s.%N; }
el() { awk -v a="$1" -v b="$(ts)" 'BEGIN{printf "%.1f", b-a}'; }
log() { echo "[run-in-vm] $*" >&2; }
T_START=$(ts)

for tool in qemu-system-x86_64 busybox cpio depmod modprobe apt-get dpkg; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/sbin/$tool" ] || [ -x "/usr/sbin/$tool" ] || {
        log "ERROR: $tool not found (install qemu-system-x86 busybox-static cpio kmod)"
        exit 2
    }
done
export PATH=$PATH:/sbin:/usr/sbin
BUSYBOX=$(command -v busybox)
if ! "$BUSYBOX" --list >/dev/null 2>&1 || ldd "$BUSYBOX" >/dev/null 2>&1; then
    [ -x /bin/busybox ] && BUSYBOX=/bin/busybox # busybox-static's; must be static
fi

# ------------------------------------------------- guest packages (cached)
mkdir -p "$WORK/debs"
T=$(ts)
GUEST_DEBS=(libibverbs1 ibverbs-providers ibverbs-utils perftest librdmacm1 libibumad3
    libpci3 libnl-3-200 libnl-route-3-200 iproute2 libbpf1 libelf1 libmnl0 libbsd0
    libcap2 libmd0 zlib1g libudev1)
download_debs() {
    local kpkg
    kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
        awk '/Depends: linux-image-[0-9]/{print $2; exit}')
    [ -n "$kpkg" ] || return 1
    rm -f "$WORK"/debs/*.deb
    (cd "$WORK/debs" && apt-get download -q "$kpkg" "${GUEST_DEBS[@]}" 2>&1 |
        grep -v 'Download is performed unsandboxed'
    exit "${PIPESTATUS[0]}")
}
if [ ! -f "$WORK/debs/.done" ]; then
    # stale package lists (a superseded kernel ABI): update once and retry
    download_debs || { apt-get update -qq && download_debs; } ||
        { log "ERROR: apt-get download of the guest packages failed"; exit 2; }
    touch "$WORK/debs/.done"
fi
KDEB=$(find "$WORK/debs" -maxdepth 1 -name "linux-image-*.deb" | sort | head -1)
KVER=$(basename "$KDEB" | sed -E 's/^linux-image-([^_]+)_.*/\1/')
if [ ! -f "$WORK/ext/.done" ]; then
    rm -rf "$WORK/ext"
    mkdir -p "$WORK/ext/kernel" "$WORK/ext/user"
    dpkg -x "$KDEB" "$WORK/ext/kernel"
    for d in "$WORK"/debs/*.deb; do
        [ "$d" = "$KDEB" ] || dpkg -x "$d" "$WORK/ext/user"
    done
    depmod -b "$WORK/ext/kernel" "$KVER"
    touch "$WORK/ext/.done"
fi
log "guest packages ready, kernel $KVER ($(el "$T")s)"
KROOT=$WORK/ext/kernel
UROOT=$WORK/ext/user
LDP=$UROOT/usr/lib/x86_64-linux-gnu:$UROOT/lib/x86_64-linux-gnu

# -------------------------------------------------- helpers to fill a root
# add_libs ROOT ELF: copy ELF's shared-library closure (by soname) into ROOT
add_libs() {
    local root=$1 elf=$2 line name path
    [ "$(head -c4 "$elf" | tr -d '\177')" = ELF ] || return 0 # not an ELF file
    LD_LIBRARY_PATH=$LDP ldd "$elf" >/dev/null 2>&1 || return 0 # static
    mkdir -p "$root/lib/x86_64-linux-gnu" "$root/lib64"
    LD_LIBRARY_PATH=$LDP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ldd "$elf" | while read -r line; do
        case $line in
        *"not found"*) log "ERROR: $elf: $line"; exit 1 ;;
        linux-vdso*) ;;
        /*ld-linux*)
            path=${line%% *}
            [ -e "$root/lib64/ld-linux-x86-64.so.2" ] ||
                cp -L "$path" "$root/lib64/ld-linux-x86-64.so.2" ;;
        *"=> /"*)
            name=${line%% =>*}
            path=${line#*=> }
            path=${path%% (*}
            [ -e "$root/lib/x86_64-linux-gnu/$name" ] ||
                [ -e "$WORK/rootfs/lib/x86_64-linux-gnu/$name" ] ||
                cp -L "$path" "$root/lib/x86_64-linux-gnu/$name" ;;
        esac
    done
}
add_elf() { install -D -m755 "$2" "$1$3"; add_libs "$1" "$2"; }

# ------------------------------------------------ base initramfs (cached)
BASE=$WORK/base-$KVER.cpio.gz
if [ ! -f "$BASE" ] || [ "$HERE/guest-init" -nt "$BASE" ] || [ "$0" -nt "$BASE" ]; then
    T=$(ts)
    R=$WORK/rootfs
    rm -rf "$R"
    mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,root,payload}
    mkdir -p "$R"/{lib/x86_64-linux-gnu,lib64}
    cp "$BUSYBOX" "$R/bin/busybox"
    for a in $("$BUSYBOX" --list); do [ "$a" = busybox ] || ln -sf busybox "$R/bin/$a"; done
    ln -sf /bin/busybox "$R/sbin/modprobe" # the kernel's request_module() helper
    for b in ibv_devices ibv_devinfo ibv_rc_pingpong ib_write_bw ib_write_lat ib_read_bw \
        ib_read_lat ib_send_lat; do
        add_elf "$R" "$UROOT/usr/bin/$b" "/usr/bin/$b"
    done
    add_elf "$R" "$UROOT/usr/bin/rdma" /usr/sbin/rdma
    add_elf "$R" "$UROOT/bin/ip" /usr/sbin/ip
    # verbs providers are dlopen()ed: copy librxe and its .driver file explicitly
    mkdir -p "$R/usr/lib/x86_64-linux-gnu/libibverbs" "$R/etc/libibverbs.d"
    cp "$UROOT/etc/libibverbs.d/rxe.driver" "$R/etc/libibverbs.d/"
    add_elf "$R" "$UROOT/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so" \
        /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so
    # glibc dlopen()s libgcc_s for pthread_cancel/backtrace; ldd never shows it
    cp -L /lib/x86_64-linux-gnu/libgcc_s.so.1 "$R/lib/x86_64-linux-gnu/"
    # kernel modules: the closure of what the init modprobes (rdma_rxe needs the crc32
    # shash, which modules.dep does not list)
    for m in crc32_pclmul crc32_generic virtio_pci virtio_net rdma_rxe ib_uverbs; do
        modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" | awk '/^insmod/{print $2}'
    done | sort -u | while read -r ko; do
        install -D -m644 "$ko" "$R${ko#"$KROOT"}"
    done
    cp "$KROOT/lib/modules/$KVER"/modules.{order,builtin,builtin.modinfo} "$R/lib/modules/$KVER/"
    depmod -b "$R" "$KVER"
    echo 'root:x:0:0:root:/root:/bin/sh' >"$R/etc/passwd"
    echo 'root:x:0:' >"$R/etc/group"
    install -m755 "$HERE/guest-init" "$R/init"
    (cd "$R" && find . | cpio -o -H newc --quiet) | gzip -1 >"$BASE.tmp"
    # an archive appended after a compressed one must start 4-byte aligned
    truncate -s %512 "$BASE.tmp"
    mv "$BASE.tmp" "$BASE"
    log "base initramfs built: $(du -h "$BASE" | cut -f1) ($(el "$T")s)"
fi
[ -n "$BUILD_ONLY" ] && exit 0

# ------------------------------------------------------ per-run payload cpio
T=$(ts)
RUNDIR=$(mktemp -d "$WORK/run.XXXXXX")
trap 'rm -rf "$RUNDIR"' EXIT
P=$RUNDIR/root
mkdir -p "$P/payload"
quote() { printf "'%s' " "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
copy_in() { # host path -> /payload/<basename>; ELF files bring their libraries
    local src=$1 dst f
    dst=$P/payload/$(basename "$1")
    cp -a "$src" "$dst"
    # ldd the originals: their RPATH ($ORIGIN/...) finds libraries of the build tree
    if [ -d "$src" ]; then
        find "$src" -type f -perm -u+x | while read -r f; do add_libs "$P" "$f"; done
    else
        add_libs "$P" "$src"
    fi
}
for f in ${EXTRA[@]+"${EXTRA[@]}"}; do copy_in "$f"; done
if [ $# -eq 0 ]; then
    set -- ibv_devinfo -v
elif [ -f "$1" ]; then
    copy_in "$1"
    prog=/payload/$(basename "$1")
    shift
    set -- "$prog" "$@"
fi
{
    echo '#!/bin/sh'
    printf 'exec '
    for a in "$@"; do quote "$a"; done
    echo
} >"$P/payload/run"
chmod 755 "$P/payload/run"
(cd "$P" && find . | cpio -o -H newc --quiet) >"$RUNDIR/payload.cpio"
cat "$BASE" "$RUNDIR/payload.cpio" >"$RUNDIR/initrd"
log "payload ready: $* ($(du -h "$RUNDIR/initrd" | cut -f1), $(el "$T")s)"

# ----------------------------------------------------------------- boot it
if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
    MACH="q35,accel=kvm"; CPU=host
else
    MACH="q35,accel=tcg"; CPU=max
fi
LOG=${TUTTI_RXE_LOG:-$WORK/last-run.log}
T=$(ts)
log "booting VM ($MACH, $VM_SMP CPUs, $VM_MEM MiB, limit ${TIMEOUT}s; serial log $LOG)"
set +e
timeout --kill-after=10 "$TIMEOUT" qemu-system-x86_64 \
    -machine "$MACH" -cpu "$CPU" -smp "$VM_SMP" -m "$VM_MEM" \
    -nodefaults -display none -no-reboot -serial stdio -monitor none \
    -netdev hubport,id=n0,hubid=0 -device virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56 \
    -kernel "$KROOT/boot/vmlinuz-$KVER" -initrd "$RUNDIR/initrd" \
    -append "console=ttyS0 panic=-1 loglevel=4" \
    </dev/null 2>&1 | sed -u 's/\r$//' | tee "$LOG"
qrc=${PIPESTATUS[0]}
set -e
rc=$(awk '/^RXE-VM-EXIT /{print $2}' "$LOG" | tail -1)
if [ -z "$rc" ]; then
    rc=99
    [ "$qrc" = 124 ] && rc=124
    log "VM ended without an exit marker (qemu/timeout rc=$qrc)"
fi
log "VM run $(el "$T")s, total $(el "$T_START")s, guest rc=$rc"
exit "$rc"
