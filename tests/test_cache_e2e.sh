#!/usr/bin/env bash
# tests/test_cache_e2e.sh - the cache through real processes and the CLI:
# hits across processes, what changes a key, running out of file
# descriptors, 8 racing processes on a cold cache, kill -9 at random
# moments, read-only layers, offline mode, an unwritable cache directory.
set -uo pipefail
CLI=${OPJIT_CLI:?}
SRC=${OPJIT_SOURCE_DIR:?}
T=${OPJIT_TEST_TMP:?}
rm -rf "$T"; mkdir -p "$T"
export OPJIT_TIERING=0 # the optimizing tier is tested in test_tier
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
no() { fail=$((fail + 1)); echo "FAIL $1"; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else no "$what"; fi; }

ops=$T/ops; mkdir -p "$ops"
cp "$SRC/ops-src/nms.c" "$SRC/ops-src/mm.c" "$SRC"/ops-src/*.h \
    "$ops/"
cat >"$ops/helper.h" <<'H'
#define SCALE 2.0f
H
cat >"$ops/twice.c" <<'C'
#include <opjit_op.h>
#include "helper.h"
static int twice(opjit_ctx *ctx, opjit_args *a) {
    DLTensor *x = opjit_arg_tensor(a, 0);
    DLTensor *y = opjit_output(ctx, 0, x->dtype, x->ndim, x->shape);
    if (!y) return -1;
    const float *xs = opjit_data(x); float *ys = y->data;
    for (int64_t i = 0; i < opjit_numel(x); i++) ys[i] = xs[i] * SCALE;
    return 0;
}
OPJIT_MODULE(twice, m) {
    opjit_def(m, "twice(Tensor x) -> Tensor", OPJIT_CPU, twice, "x * SCALE");
    opjit_require(m, "x", "float32 contiguous");
}
C

# --- hits and misses across processes ------------------------------------
C1=$T/c1
load() { OPJIT_CACHE_DIR=$C1 "$CLI" load "$@" 2>&1; }
out=$(load "$ops/twice.c")
check "first load compiles" grep -q "compiled (cache miss)" <<<"$out"
out=$(load "$ops/twice.c")
check "second process hits" grep -q "cache hit" <<<"$out"
touch "$ops/twice.c" "$ops/helper.h"
out=$(load "$ops/twice.c")
check "touching without a change still hits" grep -q "cache hit" <<<"$out"
echo "/* a comment */" >>"$ops/twice.c"
out=$(load "$ops/twice.c")
check "editing the source misses" grep -q "compiled (cache miss)" <<<"$out"
echo '#define UNUSED 1' >>"$ops/helper.h"
out=$(load "$ops/twice.c")
check "editing an included header misses" grep -q "compiled (cache miss)" <<<"$out"
cp -r "$ops" "$T/ops-moved"
out=$(load "$T/ops-moved/twice.c")
check "the same files elsewhere hit (no paths in keys)" grep -q "cache hit" <<<"$out"
check "cache verify passes" env OPJIT_CACHE_DIR="$C1" "$CLI" cache verify

# --- out of file descriptors is not damage --------------------------------
# With only a few descriptors left, opening a manifest or an artifact fails
# (EMFILE): a load fails saying why, verify reports an error, and no entry
# is called damaged, evicted or rebuilt.
snap_entries() { find "$C1/v1/entries" -name manifest -printf '%p %i %s\n' | sort; }
before=$(snap_entries)
said=0 damage=0
for n in 3 4 5 6 7 8 9 10 11 12 14 16; do
    out=$( (ulimit -n $n; OPJIT_CACHE_DIR=$C1 "$CLI" load "$ops/twice.c"; \
            OPJIT_CACHE_DIR=$C1 "$CLI" cache verify --repair) 2>&1)
    grep -q "Too many open files" <<<"$out" && said=$((said + 1))
    if grep -Eq "DAMAGED|is damaged|[1-9][0-9]* damaged|compiled" <<<"$out"; then
        damage=$((damage + 1)); echo "ulimit -n $n: $out"
    fi
done
check "EMFILE: no entry called damaged or rebuilt" test "$damage" = 0
check "EMFILE: the errors say why ($said)" test "$said" -gt 0
check "EMFILE: every entry is still there, unchanged" test "$before" = "$(snap_entries)"
check "EMFILE: cache verify passes afterwards" env OPJIT_CACHE_DIR="$C1" "$CLI" cache verify

# --- 8 processes on a cold cache -------------------------------------------
C2=$T/c2
for i in 1 2 3 4 5 6 7 8; do
    OPJIT_CACHE_DIR=$C2 "$CLI" load "$ops/mm.c" >"$T/race.$i" 2>&1 &
done
wait
compiled=$(cat "$T"/race.* | grep -c "compiled (cache miss)")
hits=$(cat "$T"/race.* | grep -c "cache hit")
check "8 racing processes: one compiles ($compiled), 7 hit ($hits)" test "$compiled" = 1 -a "$hits" = 7
check "cache verifies after the race" env OPJIT_CACHE_DIR="$C2" "$CLI" cache verify
n=$(OPJIT_CACHE_DIR=$C2 "$CLI" cache ls --json | grep -o '"key"' | wc -l)
check "one entry after the race ($n)" test "$n" = 1

# --- kill -9 at random moments ----------------------------------------------
C3=$T/c3
bad=0
for trial in $(seq 1 50); do
    if [ $((trial % 5)) = 1 ]; then OPJIT_CACHE_DIR=$C3 "$CLI" cache clear >/dev/null 2>&1; fi
    OPJIT_CACHE_DIR=$C3 "$CLI" warm --ops-path "$ops" >/dev/null 2>&1 &
    pid=$!
    sleep "0.0$((RANDOM % 10))$((RANDOM % 10))"
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    if ! OPJIT_CACHE_DIR=$C3 "$CLI" load "$ops/nms.c" >/dev/null 2>&1; then
        bad=$((bad + 1)); echo "trial $trial: load after kill failed"
    fi
    if ! OPJIT_CACHE_DIR=$C3 "$CLI" cache verify >/dev/null 2>&1; then
        bad=$((bad + 1)); echo "trial $trial: verify after kill failed"
    fi
done
check "50 kill -9 trials: every load and verify passed" test "$bad" = 0
OPJIT_CACHE_DIR=$C3 "$CLI" cache prune >/dev/null 2>&1
left=$(find "$C3/v1/tmp" -mindepth 1 2>/dev/null)
check "prune leaves no build directories behind${left:+: $left}" test -z "$left"

# --- a read-only layer, offline ---------------------------------------------
RO=$T/ro
OPJIT_CACHE_DIR=$RO "$CLI" warm --ops-path "$ops" >/dev/null 2>&1
chmod -R a-w "$RO"
before=$(find "$RO" -printf '%p %s %T@ %m\n' | sort | md5sum)
C4=$T/c4
out=$(OPJIT_CACHE_DIR=$C4 OPJIT_CACHE_READONLY=$RO OPJIT_OFFLINE=1 "$CLI" load "$ops/nms.c" 2>&1)
check "offline load from a read-only layer hits" grep -q "cache hit" <<<"$out"
after=$(find "$RO" -printf '%p %s %T@ %m\n' | sort | md5sum)
check "the read-only layer is unchanged" test "$before" = "$after"
check "nothing was written to the writable cache" test -z "$(find "$C4" -name manifest 2>/dev/null)"
chmod -R u+w "$RO"
out=$(OPJIT_CACHE_DIR=$T/c5 OPJIT_OFFLINE=1 "$CLI" load "$ops/nms.c" 2>&1)
rc=$?
check "offline miss fails (exit $rc)" test "$rc" = 1
check "offline miss names the op and says offline" grep -q "offline" <<<"$out"

# --- an unwritable cache directory -----------------------------------------
touch "$T/file"
out=$(OPJIT_CACHE_DIR=$T/file/cache "$CLI" -v load "$ops/nms.c" 2>&1)
rc=$?
check "an unusable cache directory still loads (exit $rc)" test "$rc" = 0
check "... with a warning" grep -qi "warn" <<<"$out"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
