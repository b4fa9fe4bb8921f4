#!/usr/bin/env bash
# tests/test_cache_why.sh - `opjit cache why`: the key inputs of what a
# load would use, and for a miss the closest cached entry with the inputs
# that differ (a header edited, the source edited, another compiler,
# another architecture).
# Env (set by ctest): OPJIT_CLI, OPJIT_OPS_PATH, OPJIT_TEST_TMP, OPJIT_CC.
set -euo pipefail

. "$(dirname "$0")/cli_lib.sh"
need_cli
fresh_tmp
OPS=${OPJIT_OPS_PATH:?OPJIT_OPS_PATH must name ops-src}
CC_REAL=${OPJIT_CC:-cc}
unset OPJIT_CC OPJIT_OFFLINE OPJIT_CACHE_READONLY
export OPJIT_CACHE_DIR="$T/cache" OPJIT_TIERING=0

mkdir "$T/ops"
cp "$OPS/nms.c" "$OPS"/*.h "$T/ops/"
run "$CLI" cache why nms --ops-path "$T/ops"
expect "an empty cache: not cached" 0 "tcc x86_64-linux: not cached"
check "  inputs name the source and its header" grep -q "source nms.c " "$T/out"
check "  and the header" grep -q "header nms_common.h " "$T/out"
check "  and the compiler's identity" grep -q "identity libtcc" "$T/out"
check "  no closest entry" grep -q "no entry of this source and compiler" "$T/out"

run "$CLI" load "$T/ops/nms.c"
expect "load fills the cache" 0 "[tcc]"
run "$CLI" cache why "$T/ops/nms.c"
expect "then it is cached" 0 ": cached (key"
key=$(sed -n 's/.*: cached (key \([0-9a-f]*\)).*/\1/p' "$T/out")
run "$CLI" cache ls
check "  under the key the load used" grep -q "^$key " "$T/out"

echo "/* an edit */" >>"$T/ops/nms_common.h"
run "$CLI" cache why "$T/ops/nms.c"
expect "after a header edit: not cached" 0 "not cached"
check "  the closest entry is the old one" grep -q "closest cached entry $key" "$T/out"
check "  which differs in that header only" \
    bash -c "grep -A3 'differs in' '$T/out' | grep -c ': now ' | grep -qx 1"
check "  named" grep -q "header nms_common.h: now [0-9a-f]*, cached [0-9a-f]*" "$T/out"

echo "/* another */" >>"$T/ops/nms.c"
run "$CLI" cache why "$T/ops/nms.c"
expect "after a source edit too" 0 "not cached"
check "  both differ" grep -q "source nms.c: now [0-9a-f]*, cached [0-9a-f]*" "$T/out"

# The optimizing tier: another compiler is another identity.
cat >"$T/othercc" <<EOS
#!/bin/sh
case "\$*" in *--version*) echo "othercc 1.0"; exit 0;; esac
exec "$CC_REAL" "\$@"
EOS
chmod +x "$T/othercc"
cp "$OPS/nms_common.h" "$T/ops/"
cp "$OPS/nms.c" "$T/ops/"
run env OPJIT_TIERING=1 OPJIT_CC="$CC_REAL" "$CLI" load --wait "$T/ops/nms.c"
expect "tiering on: the optimizing compile lands" 0
run env OPJIT_TIERING=1 OPJIT_CC="$CC_REAL" "$CLI" cache why "$T/ops/nms.c"
expect "  its code is cached" 0 "opt x86-64"
check "  as what a load uses" grep -q "^$T/ops/nms.c: opt .*: cached" "$T/out"
run env OPJIT_TIERING=1 OPJIT_CC="$T/othercc" "$CLI" cache why "$T/ops/nms.c"
expect "another compiler: its code is not cached" 0 "opt x86-64"
check "  the identity differs" grep -q "identity: now cc:[0-9a-f]*, cached cc:[0-9a-f]*" "$T/out"

# Device code: another architecture is another target (NVRTC needed only
# to learn its identity; without it the index entries are described).
run "$CLI" cache why "$OPS/nms.cu" --arch sm_90,compute_90
expect "a .cu: host and device artifacts" 0 "nvrtc sm_90"
check "  each architecture" grep -q "nvrtc compute_90" "$T/out"

run "$CLI" cache why no_such_op --ops-path "$T/ops"
expect "an unknown op" 1 "" "no source for op 'no_such_op'"

echo "test_cache_why: $passed passed, $failed failed"
[[ $failed == 0 ]]
