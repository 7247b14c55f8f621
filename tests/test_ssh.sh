#!/usr/bin/env bash
# tutti-run -H through a real ssh: OpenSSH's sshd, started here in network namespace B
# (10.213.7.2) with a host key and an authorized key this test makes, and the ssh client
# in A (10.213.7.1), where the launch runs. tests/test_hosts.sh runs the same launches
# through a stand-in for ssh; this one has what only the real one does: the remote login
# shell that parses the joined command line, the secret carried on the channel's stdin,
# the remote command's exit status as ssh's, and a session that outlives its client
# unless the agent sees its stdin end. Checks:
#   1. 3 ranks, 2 on A and 1 on B (through ssh, as root@B: the client's own default user
#      does not exist), of tutti-bench -c: every value checked; the agent on B runs
#      under sshd, with no secret on its command line.
#   2. Words that a shell would split or expand (spaces, quotes, $, ;, *, a backslash, an
#      empty word) in the program's arguments and in -x VAR=VALUE reach the rank on B
#      as they reach the rank on A.
#   3. A rank on B that exits 3: the launch exits 3, nothing left on either host.
#   4. The launch killed (SIGKILL) and stopped (SIGTERM): the job is gone from B, and so
#      is the sshd session that ran it.
#
#   tests/test_ssh.sh BUILD/tools/tutti-run BUILD/bench/tutti-bench  (root, iproute2 and
#                                                                    openssh-server; 77
#                                                                    without them)
set -u
run=$(realpath "$1")
bench=$(realpath "$2")
build=$(dirname "$(dirname "$run")")
cd "$(dirname "$0")/.." || exit 2
. bench/netns-lib.sh
sshd=$(command -v sshd || echo /usr/sbin/sshd)
if [ ! -x "$sshd" ] || ! command -v ssh >/dev/null || ! command -v ssh-keygen >/dev/null; then
    echo "test_ssh: needs openssh-server and openssh-client: skipped"
    exit 77
fi
# sshd without PAM refuses a locked account ("!" before its password hash, as Ubuntu
# leaves root's), even for a key
if getent shadow root 2>/dev/null | cut -d: -f2 | grep -q '^!'; then
    echo "test_ssh: root's account is locked (sshd refuses it a key login): skipped"
    exit 77
fi
netns_require test_ssh
netns_setup test-ssh "$build" bench/tutti-bench
fail() {
    echo "test_ssh: FAIL: $*"
    [ -s "$WORK/sshd.log" ] && { echo "--- sshd:"; tail -n 30 "$WORK/sshd.log"; }
    exit 1
}
A=${ADDR[0]} B=${ADDR[1]}
inA() { ip netns exec "${NS[0]}" "$@"; }

# sshd in B: its own host key, config and authorized key (root's, by key only), on B's
# address and nowhere else; privilege separation needs its empty directory
ssh-keygen -q -t ed25519 -N '' -f "$WORK/host_key" || fail "ssh-keygen (host key)"
ssh-keygen -q -t ed25519 -N '' -f "$WORK/id" || fail "ssh-keygen (client key)"
cp "$WORK/id.pub" "$WORK/authorized_keys"
chmod 700 "$WORK"
if [ ! -d /run/sshd ]; then # removed at the end, if this test made it
    mkdir -p /run/sshd && chmod 755 /run/sshd
    trap 'rc=$?; rmdir /run/sshd 2>/dev/null; (exit "$rc"); netns_cleanup' EXIT
fi
cat >"$WORK/sshd_config" <<EOF
ListenAddress $B
Port 22
HostKey $WORK/host_key
PidFile $WORK/sshd.pid
AuthorizedKeysFile $WORK/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
LogLevel VERBOSE
EOF
"$sshd" -t -f "$WORK/sshd_config" 2>"$WORK/sshd.log" || fail "sshd -t: $(cat "$WORK/sshd.log")"
ip netns exec "${NS[1]}" "$sshd" -D -e -f "$WORK/sshd_config" 2>"$WORK/sshd.log" &
PIDS+=("$!")
# the client: this test's key and nothing of the user's config; B's host key as known
echo "$B $(cut -d' ' -f1-2 "$WORK/host_key.pub")" >"$WORK/known_hosts"
cat >"$WORK/ssh_config" <<EOF
IdentityFile $WORK/id
IdentitiesOnly yes
UserKnownHostsFile $WORK/known_hosts
StrictHostKeyChecking yes
BatchMode yes
User tutti-no-such-user
ConnectTimeout 10
LogLevel ERROR
EOF
rsh="ssh -F $WORK/ssh_config"
# the client's default user does not exist: every -H names root (USER@HOST, as Open MPI's
# host files may), which must reach ssh as it is
HB=root@$B
up=
for _ in $(seq 100); do
    # shellcheck disable=SC2086
    out=$(inA $rsh "root@$B" 'echo "up $SSH_CONNECTION"' 2>&1) && up=1 && break
    sleep .1
done
[ -n "$up" ] || fail "no ssh session to $B: $out"
echo "sshd on $B: ssh from $A logs in (${out#up })"
. tests/hosts-lib.sh
# sshd's session processes on B (the listener's children)
sessions() {
    local l
    l=$(cat "$WORK/sshd.pid" 2>/dev/null) || return 0
    pgrep -P "$l" 2>/dev/null || true
}
export LD_LIBRARY_PATH=$build/lib

# 1. a job on A and B, B through ssh; the agent on B runs under sshd (SSH_CONNECTION
# from A)
hosts_check_job "$rsh" ssh-1
hosts_check_agent "$rsh" 'echo "from ${SSH_CONNECTION%% *}"'
echo "$agent_out" | grep -qx "\[1\] from $A" || fail "the agent on B not under sshd: $agent_out"

# 2. words a shell would split or expand, as arguments and as -x values: each rank
# prints them one per line between brackets; B's lines must be A's
export TT_WORDS='two  spaces; $HOME `x` "dq" '"'sq'"' * \b'
printer='for w in "$@" "$TT_WORDS" "$TT_SET"; do printf "<%s>\n" "$w"; done'
out=$(inA timeout 30 "$run" -H "$A:1,$HB:1" --rsh "$rsh" -x LD_LIBRARY_PATH -x TT_WORDS \
    -x "TT_SET=a b;c" --tag sh -c "$printer" sh 'a b' '' "it's" '$(id)' '*' 'x\y' 2>&1)
rc=$?
want=$(printf '<%s>\n' 'a b' '' "it's" '$(id)' '*' 'x\y' "$TT_WORDS" 'a b;c')
a=$(echo "$out" | sed -n 's/^\[0\] //p')
b=$(echo "$out" | sed -n 's/^\[1\] //p')
[ "$rc" = 0 ] && [ "$a" = "$want" ] && [ "$b" = "$want" ] ||
    fail "words through ssh: exit $rc
want:
$want
got:
$out"
echo "arguments and -x values with spaces, quotes, \$, ;, * and a backslash: the same on $B as on $A"

# 3. a rank on B fails
hosts_check_fail "$rsh" ssh-3

# 4. the launch killed, then stopped: each time the job and its sshd session leave B
for sig in KILL TERM; do
    ip netns exec "${NS[0]}" "$run" -H "$A:1,$HB:1" --rsh "$rsh" -x LD_LIBRARY_PATH \
        --job-id "ssh-4$sig" sh -c 'exec sleep 60' >"$WORK/four.txt" 2>&1 & # $!: tutti-run
    launch=$!
    PIDS+=("$launch")
    for _ in $(seq 200); do [ -n "$(hosts_job_procs 1 "ssh-4$sig")" ] && break; sleep .05; done
    [ -n "$(hosts_job_procs 1 "ssh-4$sig")" ] || { cat "$WORK/four.txt"; fail "nothing of the job on B"; }
    [ -n "$(sessions)" ] || fail "the job on B, but no sshd session"
    kill -"$sig" "$launch"
    wait "$launch" 2>/dev/null
    PIDS=("${PIDS[0]}")
    t0=$(date +%s%N)
    for _ in $(seq 100); do [ -z "$(hosts_job_procs 1 "ssh-4$sig")$(sessions)" ] && break; sleep .1; done
    ms=$((($(date +%s%N) - t0) / 1000000))
    [ -z "$(hosts_job_procs 1 "ssh-4$sig")" ] ||
        fail "left on B 10 s after the launch got SIG$sig: $(hosts_job_procs 1 "ssh-4$sig")"
    [ -z "$(sessions)" ] || fail "sshd sessions left on B 10 s after SIG$sig: $(sessions)"
    echo "the launch sent SIG$sig: the job and its ssh session gone from $B in $ms ms"
done
echo "test_ssh: ok"
