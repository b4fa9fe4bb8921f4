#!/usr/bin/env bash
# tests/test_remote.sh - the remote cache layer on a real Redis server
# (redis-server from Debian, started here on 127.0.0.1 with a free port and
# a unix socket, nothing saved, stopped by its PID at the end, also on
# failure): sharing between processes with separate local caches, one
# compile per fleet, a compiling process killed while it holds the fleet
# lock, a dead, paused, restarted and full server, and values that are
# flipped, truncated, swapped or re-signed (deleted), or intact and signed
# with another key or unsigned (kept).
# Skipped (77) without redis-server.
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
export OPJIT_CUDA_ARCHS=sm_90

BLOCKED_CC=
cleanup() {
    stop_redis
    rm -f "$T/cc.block"
    [[ -n "$BLOCKED_CC" ]] && kill -KILL "$BLOCKED_CC" 2>/dev/null || true
}
trap cleanup EXIT

start_redis
fleet_keys
export OPJIT_REMOTE_CACHE=redis://127.0.0.1:$PORT

# --- NVRTC: the .cu ops need it ------------------------------------------------------

CU=1
run env OPJIT_CACHE_DIR="$T/probe" OPJIT_REMOTE_CACHE= "$CLI" load "$OPS/nms.cu"
if [[ $rc != 0 ]]; then
    echo "note: no NVRTC here ($(head -1 "$T/err")); the .cu checks are skipped" >&2
    CU=0
fi

# --- two processes, separate local caches: the second compiles nothing ------------

run env OPJIT_CACHE_DIR="$T/a" "$CLI" warm --opt
expect "warm (process A) publishes to the remote" 0 "warm:"
sources=("$OPS"/*.c)
((CU)) && sources+=("$OPS"/*.cu)
keys_before=$(rcli DBSIZE)
run env OPJIT_CACHE_DIR="$T/b" OPJIT_REMOTE_MODE=ro "$CLI" load -v "${sources[@]}"
expect "process B loads every shipped op" 0 "remote cache hit"
check "B: nothing compiled (stdout)" test "$(count "compiled" "$T/out")" = 0
check "B: nothing compiled (log)" test "$(count "): compiled" "$T/err")" = 0
check "B: every source a remote hit" test "$(count ": remote cache hit" "$T/out")" = "${#sources[@]}"
check "B: the optimized tier came from the remote" grep -qF "opt (" "$T/err"
check "B: read-only mode wrote nothing" test "$(rcli DBSIZE)" = "$keys_before"
check "B: per-artifact origins in the log" grep -qF "tcc (x86_64-linux" "$T/err"
if ((CU)); then
    check "B: device code from the remote" grep -qE "nvrtc \(sm_90, [0-9a-f]+\): remote hit" "$T/err"
fi
run env OPJIT_CACHE_DIR="$T/b" "$CLI" cache verify
expect "B: what came from the remote verifies locally" 0 "0 damaged"

# The same over the unix socket.
run env OPJIT_CACHE_DIR="$T/b-unix" OPJIT_REMOTE_CACHE="redis+unix://$SOCK" OPJIT_TIERING=0 \
    "$CLI" load "$OPS/nms.c"
expect "a unix socket serves too" 0 "remote cache hit"

# ls and info --remote.
run env OPJIT_CACHE_DIR="$T/b" "$CLI" cache ls --remote
expect "cache ls --remote" 0 "nms.c"
check "cache ls --remote: the layer" grep -qF "remote" "$T/out"
run env OPJIT_CACHE_DIR="$T/b" "$CLI" cache info --remote
expect "cache info --remote" 0 "signed entries"
check "cache info --remote: entries" grep -qE "^entries: +[1-9]" "$T/out"

# warm --remote pushes what is found locally (into an empty database 3).
run env OPJIT_CACHE_DIR="$T/a" OPJIT_REMOTE_CACHE="redis://127.0.0.1:$PORT/3" "$CLI" warm --remote nms
expect "warm --remote" 0 "hit"
check "warm --remote: entries pushed" test "$(redis-cli -p "$PORT" -n 3 DBSIZE)" -gt 0

# --- trust: no key, a key others may read -------------------------------------------

run env OPJIT_CACHE_DIR="$T/nokey" OPJIT_REMOTE_KEY_FILE= OPJIT_TIERING=0 "$CLI" load "$OPS/nms.c"
expect "no key: the remote is off, the load works" 0 "compiled" "no fleet key"
cp "$T/fleet.key" "$T/open.key"
chmod 644 "$T/open.key"
run env OPJIT_CACHE_DIR="$T/openkey" OPJIT_REMOTE_KEY_FILE="$T/open.key" OPJIT_TIERING=0 \
    "$CLI" load "$OPS/nms.c"
expect "a key file others can read is refused" 0 "compiled" "readable by group or others"

# --- 8 processes, empty caches, one cold key: one compile ----------------------------

cold_source "$T/eight/cold8.c" eight
pids=()
for i in $(seq 8); do
    env OPJIT_CACHE_DIR="$T/eight-$i" OPJIT_TIERING=0 "$CLI" load "$T/eight/cold8.c" \
        >"$T/eight-$i.out" 2>"$T/eight-$i.err" &
    pids+=($!)
done
ok=0
for p in "${pids[@]}"; do wait "$p" && ok=$((ok + 1)); done
compiled=$(cat "$T"/eight-*.out | count "compiled (cache miss)" /dev/stdin)
remote=$(cat "$T"/eight-*.out | count "remote cache hit" /dev/stdin)
check "8 processes: 8 successes ($ok)" test "$ok" = 8
check "8 processes: exactly one compile ($compiled)" test "$compiled" = 1
check "8 processes: 7 remote hits ($remote)" test "$remote" = 7
echo "8 processes on a cold key: $ok succeeded, $compiled compiled, $remote remote hits" >&2

# --- the compiling process is killed while it holds the fleet lock -------------------

# A compiler that waits while $T/cc.block exists (only when compiling).
cat >"$T/slowcc" <<EOF
#!/bin/sh
case " \$* " in *" -shared "*|*" -c "*)
    echo \$\$ >"$T/cc.pid"
    while [ -e "$T/cc.block" ]; do sleep 0.05; done ;;
esac
exec "${OPJIT_CC:-cc}" "\$@"
EOF
chmod 755 "$T/slowcc"
cold_source "$T/kill/killed.c" killed
export OPJIT_REMOTE_LEASE=2
touch "$T/cc.block"
env OPJIT_CACHE_DIR="$T/kill-a" OPJIT_CC="$T/slowcc" "$CLI" load "$T/kill/killed.c" \
    >"$T/kill-a.out" 2>"$T/kill-a.err" &
holder=$!
for _ in $(seq 200); do
    [[ -s "$T/cc.pid" && -n "$(rcli --scan --pattern 'opjit:v1:lock:*')" ]] && break
    sleep 0.05
done
check "the holder took the fleet lock" test -n "$(rcli --scan --pattern 'opjit:v1:lock:*')"
# The optimizing compile runs in the load's detached helper process (the
# parent of the blocked cc): that is the holder to kill.
wait "$holder" 2>/dev/null || true
BLOCKED_CC=$(cat "$T/cc.pid" 2>/dev/null || true)
helper=$(ps -o ppid= -p "$BLOCKED_CC" 2>/dev/null | tr -d ' ' || true)
check "the holder is the load's helper process" test -n "$helper"
kill -KILL "$helper" 2>/dev/null || true
kill -KILL "$BLOCKED_CC" 2>/dev/null || true
rm -f "$T/cc.block"
t0=$(now_ms)
pids=()
for i in 1 2 3; do
    env OPJIT_CACHE_DIR="$T/kill-$i" OPJIT_CC="$T/slowcc" "$CLI" load --wait -v "$T/kill/killed.c" \
        >"$T/kill-$i.out" 2>"$T/kill-$i.err" &
    pids+=($!)
done
ok=0
for p in "${pids[@]}"; do wait "$p" && ok=$((ok + 1)); done
ms=$(($(now_ms) - t0))
opt_swapped=$(cat "$T"/kill-[123].err | count "optimizing C compiler code for " /dev/stdin)
opt_remote=$("$CLI" cache ls --remote 2>/dev/null | awk '$5 == "opt"' | grep -c killed || true)
check "holder killed: the others succeed ($ok of 3)" test "$ok" = 3
check "holder killed: within the lease and a compile ($ms ms)" test "$ms" -lt 15000
check "holder killed: each waiter's optimized code serves ($opt_swapped of 3)" test "$opt_swapped" = 3
check "holder killed: the optimized entry reached the remote" test "$opt_remote" -ge 1
echo "holder SIGKILLed: 3 waiters (load --wait) done in $ms ms (lease 2 s)" >&2
unset OPJIT_REMOTE_LEASE

# --- faults during loads ---------------------------------------------------------------

# fault_sources NAME: three sources nobody has built, in FAULT_SRCS.
fault_sources() {
    FAULT_SRCS=()
    for op in nms mm conv2d; do
        cold_source "$T/src-$1/$op.c" "$1" "$op"
        FAULT_SRCS+=("$T/src-$1/$op.c")
    done
}
# fault_load NAME LIMIT_MS [ENV...]: load three new sources with an empty
# local cache; every load must succeed, with at most one warning about the
# remote, within what compiling takes plus LIMIT_MS.
fault_load() {
    local name=$1 limit=$2
    shift 2
    local t0 ms
    fault_sources "$name"
    t0=$(now_ms)
    run env OPJIT_CACHE_DIR="$T/fault-$name" OPJIT_TIERING=0 "$@" "$CLI" load "${FAULT_SRCS[@]}"
    ms=$(($(now_ms) - t0))
    expect "$name: every load succeeds" 0 "nms"
    local warns
    warns=$(count "remote cache" "$T/err")
    check "$name: at most one warning ($warns)" test "$warns" -le 1
    check "$name: within $BASE_MS ms of compiling + $limit ms ($ms ms)" \
        test "$ms" -lt $((BASE_MS * 2 + limit + 2000))
    echo "fault $name: 3 loads in $ms ms (no remote: $BASE_MS ms), $warns warning(s)" >&2
}
fault_sources base
t0=$(now_ms)
run env OPJIT_CACHE_DIR="$T/fault-base" OPJIT_TIERING=0 OPJIT_REMOTE_CACHE= "$CLI" load "${FAULT_SRCS[@]}"
BASE_MS=$(($(now_ms) - t0))
expect "the loads without a remote" 0 "nms"

# Paused (a partition): each request waits its time limit once, then the
# layer backs off.
kill -STOP "$REDIS_PID"
fault_load paused 500 OPJIT_REMOTE_TIMEOUT=0.5
kill -CONT "$REDIS_PID"

# Full: maxmemory 1mb with noeviction refuses every write.
rcli CONFIG SET maxmemory 1mb >/dev/null
rcli CONFIG SET maxmemory-policy noeviction >/dev/null
fault_load full 0
check "full: the refusal was warned about" grep -qF "refused an entry" "$T/err"
rcli CONFIG SET maxmemory 0 >/dev/null

# Restarted empty while a process is connected: the next command reconnects
# at once (no back-off), so the entry built after the restart is shared.
# (The optimized build runs in the load's helper process; --wait keeps the
# load until the helper has published.)
# Its artifacts are large (8 MiB of data): storing one writes more than a
# socket takes at once, and a write on a connection the server closed
# must not kill the process with SIGPIPE.
cold_source "$T/restart/restarted.c" restarted
echo "char opjit_test_pad[8 << 20] = {1};" >>"$T/restart/restarted.c"
touch "$T/cc.block"
rm -f "$T/cc.pid"
env OPJIT_CACHE_DIR="$T/restart-a" OPJIT_CC="$T/slowcc" "$CLI" load --wait "$T/restart/restarted.c" \
    >"$T/restart.out" 2>"$T/restart.err" &
loader_pid=$!
for _ in $(seq 200); do [[ -s "$T/cc.pid" ]] && break; sleep 0.05; done
stop_redis
start_redis
rm -f "$T/cc.block"
wait "$loader_pid" && restart_rc=0 || restart_rc=$?
check "restarted: the load succeeds" test "$restart_rc" = 0
check "restarted: no warning" test "$(count "remote cache" "$T/restart.err")" = 0
check "restarted: the optimized entry is in the new server" test "$(rcli DBSIZE)" -gt 0

# Dead: connections are refused.
stop_redis
fault_load dead 100

# --- values rejected: flipped, truncated, swapped, another key, unsigned -------------

start_redis
cold_source "$T/bad/victim.c" victim
run env OPJIT_CACHE_DIR="$T/bad-0" OPJIT_TIERING=0 "$CLI" load -v "$T/bad/victim.c"
expect "the victim's entry is published" 0 "compiled"
VKEY=$(grep -oE "victim.c tcc \(x86_64-linux, [0-9a-f]{32}\)" "$T/err" | grep -oE "[0-9a-f]{32}")
check "the victim's key is logged" test -n "$VKEY"
RKEY=opjit:v1:$VKEY
rcli --raw GET "$RKEY" | head -c -1 >"$T/good.val"
run env OPJIT_CACHE_DIR="$T/bad-mm" OPJIT_TIERING=0 "$CLI" load -v "$OPS/mm.c"
expect "another entry is published" 0
OTHER=$(grep -oE "mm.c tcc \(x86_64-linux, [0-9a-f]{32}\)" "$T/err" | grep -oE "[0-9a-f]{32}")
rcli --raw GET "opjit:v1:$OTHER" | head -c -1 >"$T/other.val"
size=$(stat -c %s "$T/good.val")
check "the value was read back ($size bytes)" test "$size" -gt 1000

# put_value FILE: store FILE under the victim's key.
put_value() { rcli DEL "$RKEY" >/dev/null; redis-cli -p "$PORT" -x SET "$RKEY" <"$1" >/dev/null; }
value_sum() { rcli --raw GET "$RKEY" | sha256sum; }
# rejected NAME [ENV...]: the value is damaged for every reader: a fresh
# process must reject it (one warning), delete it, compile, load, and put a
# good value back.
rejected() {
    local name=$1 n=$((++bad_n))
    shift
    run env OPJIT_CACHE_DIR="$T/bad-$n" OPJIT_TIERING=0 "$@" "$CLI" load -v "$T/bad/victim.c"
    expect "$name: the load succeeds, compiled" 0 "compiled (cache miss)" "is rejected"
    check "$name: one warning" test "$(count "is rejected" "$T/err")" = 1
    check "$name: deleted" grep -qF "deleting it" "$T/err"
    run env OPJIT_CACHE_DIR="$T/bad-$n-after" OPJIT_TIERING=0 "$@" "$CLI" load "$T/bad/victim.c"
    expect "$name: a good value is back in the remote" 0 "remote cache hit"
}
# kept NAME [ENV...]: the value is intact but not signed with this
# process's key (another fleet key's, as during a key rotation): a fresh
# process must reject it (one warning), compile and load, and leave it as
# it was for the readers it is good for.
kept() {
    local name=$1 n=$((++bad_n)) before
    shift
    before=$(value_sum)
    run env OPJIT_CACHE_DIR="$T/bad-$n" OPJIT_TIERING=0 "$@" "$CLI" load -v "$T/bad/victim.c"
    expect "$name: the load succeeds, compiled" 0 "compiled (cache miss)" "is rejected"
    check "$name: one warning" test "$(count "is rejected" "$T/err")" = 1
    check "$name: kept" grep -qF "keeping it" "$T/err"
    check "$name: the value is left as it was" test "$(value_sum)" = "$before"
}
# resign IN OUT KEYFILE: IN with a byte of its body flipped, signed again
# with KEYFILE (a writer with that key that stored a bad value).
resign() {
    /usr/bin/python3 - "$1" "$2" "$3" "$RKEY" <<'PY2'
import hashlib, hmac, sys
v = open(sys.argv[1], "rb").read()
body = bytearray(v[v.index(b"\n") + 1:])
body[len(body) * 2 // 3] ^= 0x10
mac = hmac.new(open(sys.argv[3], "rb").read(),
               b"opjit-remote-signature 1\n" + sys.argv[4].encode() + b"\0" + bytes(body),
               hashlib.sha256).hexdigest()
open(sys.argv[2], "wb").write(b"opjit-remote 1 hmac-sha256 " + mac.encode() + b"\n" + bytes(body))
PY2
}
bad_n=0
/usr/bin/python3 -c 'import sys; b = bytearray(open(sys.argv[1], "rb").read()); b[len(b) * 2 // 3] ^= 0x10; open(sys.argv[2], "wb").write(b)' "$T/good.val" "$T/flipped.val"
put_value "$T/flipped.val"
rejected flipped
head -c $((size / 2)) "$T/good.val" >"$T/truncated.val"
put_value "$T/truncated.val"
rejected truncated
put_value "$T/other.val"
rejected swapped
resign "$T/good.val" "$T/own-bad.val" "$T/fleet.key"
put_value "$T/own-bad.val"
rejected "damaged, signed with our key"
resign "$T/good.val" "$T/other-bad.val" "$T/other.key"
put_value "$T/other-bad.val"
rejected "damaged, signed with another key"
# Intact values of other writers: never deleted by a reader without their key.
rcli DEL "$RKEY" >/dev/null
run env OPJIT_CACHE_DIR="$T/bad-otherkey" OPJIT_TIERING=0 OPJIT_REMOTE_KEY_FILE="$T/other.key" \
    "$CLI" load "$T/bad/victim.c"
expect "a process with another key publishes" 0
kept "signed with another key"
run env OPJIT_CACHE_DIR="$T/bad-otherkey-2" OPJIT_TIERING=0 OPJIT_REMOTE_KEY_FILE="$T/other.key" \
    "$CLI" load "$T/bad/victim.c"
expect "signed with another key: its own fleet still gets it" 0 "remote cache hit"
rcli DEL "$RKEY" >/dev/null
run env OPJIT_CACHE_DIR="$T/bad-unsigned" OPJIT_TIERING=0 OPJIT_REMOTE_KEY_FILE= \
    OPJIT_REMOTE_TRUST=unsigned "$CLI" load "$T/bad/victim.c"
expect "an unsigned process publishes" 0
kept unsigned
# Unsigned mode still checks the entry itself: a flipped artifact byte.
put_value "$T/flipped.val"
rejected "flipped, unsigned reader" OPJIT_REMOTE_KEY_FILE= OPJIT_REMOTE_TRUST=unsigned

check "no sanitizer finding in the processes run in the background" \
    bash -c "! grep -qE 'Sanitizer|runtime error:' '$T'/*.err"

echo "test_remote: $passed passed, $failed failed"
[[ $failed == 0 ]]
