#!/usr/bin/env bash
# tests/test_cli_warm.sh - `opjit warm` fills the cache or says it did not:
# an artifact that was not published (a size limit, a full disk) is a
# failure with exit 1, and --opt on cached sources counts what it compiled.
#
# Env (set by ctest): OPJIT_CLI, OPJIT_OPS_PATH, OPJIT_TEST_TMP.
set -euo pipefail

. "$(dirname "$0")/cli_lib.sh"
need_cli
fresh_tmp
OPS=${OPJIT_OPS_PATH:?OPJIT_OPS_PATH must name ops-src}
unset OPJIT_TIERING OPJIT_OFFLINE OPJIT_CACHE_READONLY OPJIT_CACHE_MAX_SIZE
export OPJIT_OPS_PATH="$T/ops"
mkdir -p "$T/ops"
cp "$OPS"/nms.c "$OPS"/mm.c "$OPS"/*.h "$T/ops/"

# A cache too small for what it is asked to hold: warm says so.
export OPJIT_CACHE_DIR="$T/small"
run env OPJIT_CACHE_MAX_SIZE=16K "$CLI" warm
expect "warm into a 16 KiB cache fails" 1 "" "size limit is too small"
check "  and its summary counts the failures" grep -q "failed" "$T/out"

# Room enough: every source compiled, then every one a hit.
export OPJIT_CACHE_DIR="$T/cache"
run "$CLI" warm
expect "warm into an empty cache" 0 "2 compiled, 0 failed"
run "$CLI" warm
expect "warm again: hits" 0 "2 cache hits, 0 compiled"

# --opt on sources whose libtcc code is cached compiles the optimizing tier.
run "$CLI" warm --opt
expect "warm --opt after warm compiles the optimized tier" 0 "0 cache hits, 2 compiled"
run "$CLI" warm --opt
expect "warm --opt again: hits" 0 "2 cache hits, 0 compiled"

echo "test_cli_warm: $passed passed, $failed failed"
[[ $failed == 0 ]]
