#!/usr/bin/env bash
# tests/test_sample.sh - the sample host application (samples/nms_demo.c),
# as built by the project: compiles nms.c on an empty cache, then hits it
# from a second process; both keep the same boxes.
set -u
DEMO=${OPJIT_NMS_DEMO:?}
T=${OPJIT_TEST_TMP:?}
rm -rf "$T"; mkdir -p "$T"
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL $1"; fi; }
export OPJIT_CACHE_DIR=$T/cache
"$DEMO" 3000 0.5 >"$T/first" 2>&1; rc1=$?
"$DEMO" 3000 0.5 >"$T/second" 2>&1; rc2=$?
check "first run succeeds (exit $rc1)" '[ $rc1 = 0 ]'
check "second run succeeds (exit $rc2)" '[ $rc2 = 0 ]'
check "it reports kept boxes" 'grep -q "3000 boxes, IoU threshold 0.50 -> kept [1-9]" "$T/first"'
check "both runs keep the same boxes" '[ "$(grep -E "kept|first kept" "$T/first")" = "$(grep -E "kept|first kept" "$T/second")" ]'
check "the cache holds nms after the first run" '[ -n "$(find "$T/cache" -name manifest | head -1)" ]'
"$DEMO" -1 >"$T/bad" 2>&1; rc=$?
check "a bad argument exits 2 (exit $rc)" '[ $rc = 2 ]'
OPJIT_OPS_PATH=$T/empty "$DEMO" 10 >"$T/none" 2>&1; rc=$?
check "no nms on the path: exit 1 with the reason (exit $rc)" '[ $rc = 1 ] && grep -q "no source for op .nms." "$T/none"'
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
