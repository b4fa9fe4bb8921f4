#!/usr/bin/env bash
# tests/test_remote_fake_server.sh - the remote cache against a misbehaving
# server (tests/fake_resp.py, a tiny RESP server on 127.0.0.1, stopped by
# its PID): one that sends its reply a byte at a time costs a load the
# request time limit once, not the reply's length times the interval; one
# whose SCAN cursor never comes back to 0 costs `cache ls --remote` and
# `cache info --remote` a bounded walk, said to be incomplete.
#
# Env (set by ctest): OPJIT_CLI, OPJIT_OPS_PATH, OPJIT_TEST_TMP.
set -euo pipefail

. "$(dirname "$0")/cli_lib.sh"
need_cli
fresh_tmp
. "$(dirname "$0")/remote_lib.sh"
OPS=${OPJIT_OPS_PATH:?OPJIT_OPS_PATH must name ops-src}
unset OPJIT_CACHE_DIR OPJIT_CACHE_READONLY OPJIT_REMOTE_MODE OPJIT_REMOTE_TRUST OPJIT_OFFLINE
fleet_keys

FAKE_PID=
stop_fake() {
    if [[ -n "$FAKE_PID" ]]; then
        kill -KILL "$FAKE_PID" 2>/dev/null || true
        wait "$FAKE_PID" 2>/dev/null || true
        FAKE_PID=
    fi
}
trap stop_fake EXIT
# start_fake MODE [ARGS...]: the fake server; OPJIT_REMOTE_CACHE names it.
start_fake() {
    stop_fake
    rm -f "$T/fake.port"
    /usr/bin/python3 "$(dirname "$0")/fake_resp.py" "$T/fake.port" "$@" 2>"$T/fake.log" &
    FAKE_PID=$!
    for _ in $(seq 100); do
        [[ -s "$T/fake.port" ]] && break
        sleep 0.05
    done
    export OPJIT_REMOTE_CACHE=redis://127.0.0.1:$(cat "$T/fake.port")
}

# --- a reply sent a byte every 0.3 s -----------------------------------------------

cold_source "$T/src/dripped.c" dripped
t0=$(now_ms)
run env OPJIT_CACHE_DIR="$T/base" OPJIT_TIERING=0 OPJIT_REMOTE_CACHE= "$CLI" load "$T/src/dripped.c"
BASE_MS=$(($(now_ms) - t0))
expect "the load without a remote" 0 "compiled"

# 100 bytes a 0.3 s: 30 s for the whole reply, though every read gets a
# byte well within the 0.5 s limit. (timeout bounds the test when it fails.)
start_fake drip 100 0.3
t0=$(now_ms)
run timeout 25 env OPJIT_CACHE_DIR="$T/drip" OPJIT_TIERING=0 OPJIT_REMOTE_TIMEOUT=0.5 \
    "$CLI" load "$T/src/dripped.c"
ms=$(($(now_ms) - t0))
expect "drip: the load succeeds, compiled" 0 "compiled (cache miss)" "no answer in time"
check "drip: one warning" test "$(count "remote cache" "$T/err")" = 1
check "drip: within the 0.5 s limit and a compile ($ms ms; no remote: $BASE_MS ms)" \
    test "$ms" -lt $((BASE_MS + 500 + 1500))
echo "drip: the load took $ms ms (0.5 s request limit; without a remote $BASE_MS ms)" >&2

# The whole request is bounded, connecting included: a second process
# meanwhile gets the local build lock at once after the first one's limit.
cold_source "$T/src/dripped2.c" dripped2
t0=$(now_ms)
pids=()
for i in 1 2; do
    timeout 25 env OPJIT_CACHE_DIR="$T/drip-shared" OPJIT_TIERING=0 OPJIT_REMOTE_TIMEOUT=0.5 \
        "$CLI" load "$T/src/dripped2.c" >"$T/drip-$i.out" 2>"$T/drip-$i.err" &
    pids+=($!)
done
ok=0
for p in "${pids[@]}"; do wait "$p" && ok=$((ok + 1)); done
ms=$(($(now_ms) - t0))
check "drip, two processes, one cache: both succeed ($ok)" test "$ok" = 2
check "drip, two processes: within two limits and a compile ($ms ms)" \
    test "$ms" -lt $((BASE_MS + 1000 + 2000))
echo "drip: two processes sharing a local cache took $ms ms" >&2

# --- a SCAN cursor that never comes back to 0 ---------------------------------------

start_fake scan
t0=$(now_ms)
run timeout 25 env OPJIT_CACHE_DIR="$T/scan" "$CLI" cache ls --remote
ms=$(($(now_ms) - t0))
expect "scan: cache ls --remote ends, failing" 1 "" "did not end"
check "scan: ls within 5 s ($ms ms)" test "$ms" -lt 5000
check "scan: ls listed what it saw" grep -qF "remote" "$T/out"
echo "scan: cache ls --remote ended in $ms ms" >&2
t0=$(now_ms)
run timeout 25 env OPJIT_CACHE_DIR="$T/scan" "$CLI" cache info --remote
ms=$(($(now_ms) - t0))
expect "scan: cache info --remote ends" 0 "entries:" "counts are incomplete"
check "scan: info within 5 s ($ms ms)" test "$ms" -lt 5000
echo "scan: cache info --remote ended in $ms ms" >&2

check "no sanitizer finding in the processes run in the background" \
    bash -c "! grep -qE 'Sanitizer|runtime error:' '$T'/*.err"

echo "test_remote_fake_server: $passed passed, $failed failed"
[[ $failed == 0 ]]
