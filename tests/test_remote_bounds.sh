#!/usr/bin/env bash
# tests/test_remote_bounds.sh - what someone who can write to the fleet's
# Redis (no fleet key needed) can cost a load, on a real redis-server
# (127.0.0.1, a free port, stopped by its PID): a 300 MiB value planted
# under a key is refused from its length, not downloaded (deleted, or kept
# in read-only mode); a build lock planted without a time limit, or with
# one over the lease, is taken over at once (a lock within the lease is
# waited for). And no descriptor opjit opens (the Redis socket, the cache's
# files and locks) reaches the programs it runs. Skipped (77) without
# redis-server.
#
# Env (set by ctest): OPJIT_CLI, OPJIT_OPS_PATH, OPJIT_TEST_TMP, OPJIT_CC.
set -euo pipefail

. "$(dirname "$0")/cli_lib.sh"
need_cli
fresh_tmp
. "$(dirname "$0")/remote_lib.sh"
need_redis
OPS=${OPJIT_OPS_PATH:?OPJIT_OPS_PATH must name ops-src}
unset OPJIT_CACHE_DIR OPJIT_CACHE_READONLY OPJIT_REMOTE_MODE OPJIT_REMOTE_TRUST OPJIT_OFFLINE
trap stop_redis EXIT
start_redis
fleet_keys
export OPJIT_REMOTE_CACHE=redis://127.0.0.1:$PORT

# peak_rss_kb CMD...: run CMD like run does; $rss: the largest resident
# size of the processes it ran, in KiB.
peak_rss_kb() {
    run /usr/bin/python3 -c '
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    f.write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(rc)' "$T/rss" "$@"
    rss=$(cat "$T/rss")
}

# --- a value over the size bound ---------------------------------------------------

cold_source "$T/src/big.c" big
KEY=$(tcc_key "$T/src/big.c")
check "the key of big.c" test -n "$KEY"
peak_rss_kb env OPJIT_CACHE_DIR="$T/big-base" OPJIT_TIERING=0 OPJIT_REMOTE_CACHE= \
    "$CLI" load "$T/src/big.c"
BASE_RSS=$rss
# plant_big: 300 MiB under big.c's key (zeros; no fleet key needed).
plant_big() {
    rcli DEL "opjit:v1:$KEY" >/dev/null
    rcli SETRANGE "opjit:v1:$KEY" $((300 << 20)) x >/dev/null
}
plant_big
t0=$(now_ms)
peak_rss_kb env OPJIT_CACHE_DIR="$T/big-1" OPJIT_TIERING=0 "$CLI" load "$T/src/big.c"
ms=$(($(now_ms) - t0))
expect "300 MiB value: the load succeeds, compiled" 0 "compiled (cache miss)" "over 256 MiB"
check "300 MiB value: not downloaded (peak RSS $rss KiB; without a remote $BASE_RSS KiB)" \
    test "$rss" -lt $((BASE_RSS + 32768))
check "300 MiB value: deleted, and a good one stored ($(rcli STRLEN "opjit:v1:$KEY") bytes)" \
    test "$(rcli STRLEN "opjit:v1:$KEY")" -lt $((1 << 20))
echo "300 MiB value: load in $ms ms, peak RSS $rss KiB (no remote: $BASE_RSS KiB)" >&2
run env OPJIT_CACHE_DIR="$T/big-2" OPJIT_TIERING=0 "$CLI" load "$T/src/big.c"
expect "300 MiB value: the next process gets the good value" 0 "remote cache hit"

plant_big
peak_rss_kb env OPJIT_CACHE_DIR="$T/big-ro" OPJIT_TIERING=0 OPJIT_REMOTE_MODE=ro \
    "$CLI" load "$T/src/big.c"
expect "300 MiB value, read-only: the load succeeds" 0 "compiled (cache miss)" "read-only mode"
check "300 MiB value, read-only: not downloaded (peak RSS $rss KiB)" \
    test "$rss" -lt $((BASE_RSS + 32768))
check "300 MiB value, read-only: left in place" \
    test "$(rcli STRLEN "opjit:v1:$KEY")" -gt $((300 << 20))
rcli DEL "opjit:v1:$KEY" >/dev/null

# --- planted build locks -------------------------------------------------------------

export OPJIT_REMOTE_LEASE=2
# locked NAME SET-ARGS...: plant the lock of a new source's key with SET
# ARGS; load it, timed ($ms).
locked() {
    local name=$1 key
    shift
    cold_source "$T/src/$name.c" "$name"
    key=$(tcc_key "$T/src/$name.c")
    rcli SET "opjit:v1:lock:$key" planted "$@" >/dev/null
    t0=$(now_ms)
    run env OPJIT_CACHE_DIR="$T/lock-$name" OPJIT_TIERING=0 "$CLI" load "$T/src/$name.c"
    ms=$(($(now_ms) - t0))
    LOCK_KEY=$key
}
locked nottl
expect "a lock without a time limit: the load succeeds" 0 "compiled (cache miss)" "taken over"
check "a lock without a time limit: not waited for ($ms ms; lease 2 s)" test "$ms" -lt 1500
check "a lock without a time limit: released after the build" \
    test "$(rcli EXISTS "opjit:v1:lock:$LOCK_KEY")" = 0
check "a lock without a time limit: the entry is shared" \
    test "$(rcli EXISTS "opjit:v1:$LOCK_KEY")" = 1
echo "a lock planted without a TTL: load in $ms ms (lease 2 s)" >&2
locked longttl PX 600000
expect "a lock over the lease: the load succeeds" 0 "compiled (cache miss)" "taken over"
check "a lock over the lease: not waited for ($ms ms; lease 2 s)" test "$ms" -lt 1500
locked held PX 1000
expect "a lock within the lease: the load succeeds" 0 "compiled (cache miss)"
check "a lock within the lease: waited for ($ms ms)" test "$ms" -ge 900
check "a lock within the lease: not taken over" test "$(count "taken over" "$T/err")" = 0
unset OPJIT_REMOTE_LEASE

# --- descriptors: none reaches the compiler opjit runs ------------------------------

# A compiler that lists its open descriptors before compiling: fds 0-2 are
# what opjit gives it, and fd 3 the optimizer helper's compile slot
# (locks/slot.N: held while the helper or its compiler runs); any other
# that is a socket or a file under $T (caches, locks; the script itself
# excepted) leaked from the process that ran it.
cat >"$T/fdcc" <<EOF
#!/bin/sh
case " \$* " in *" -shared "*|*" -c "*)
    (ls -l /proc/\$\$/fd) >"$T/fds.\$\$" ;; # a subshell: the shell's own fds stay as they are
esac
exec "${OPJIT_CC:-cc}" "\$@"
EOF
chmod 755 "$T/fdcc"
# leaks: the descriptors above 2 in the listings that are sockets or files
# under $T, but the script and the slot.
leaks() {
    cat "$T"/fds.* 2>/dev/null | awk 'NF >= 11 && $9 > 2 { print $9, $11 }' |
        grep -E "socket:|$T" | grep -vF "$T/fdcc" | grep -vE "^3 .*/locks/slot\.[0-9]+$" || true
}
cold_source "$T/src/fds.c" fds
rm -f "$T"/fds.*
run env OPJIT_CACHE_DIR="$T/fds-1" OPJIT_CC="$T/fdcc" "$CLI" load --wait "$T/src/fds.c"
expect "fds: a load, optimized in the background" 0 "compiled"
check "fds: the compiler ran" test -n "$(ls "$T"/fds.* 2>/dev/null)"
check "fds: nothing leaked into it: $(leaks | tr '\n' ' ')" test -z "$(leaks)"
cold_source "$T/src/fds2.c" fds2
rm -f "$T"/fds.*
run env OPJIT_CACHE_DIR="$T/fds-2" OPJIT_CC="$T/fdcc" "$CLI" warm --opt "$T/src/fds2.c"
expect "fds: warm --opt" 0
check "fds: warm ran the compiler" test -n "$(ls "$T"/fds.* 2>/dev/null)"
check "fds: nothing leaked into warm's compiler: $(leaks | tr '\n' ' ')" test -z "$(leaks)"

echo "test_remote_bounds: $passed passed, $failed failed"
[[ $failed == 0 ]]
