#!/usr/bin/env bash
# tests/test_abi_grow.sh - a host built against include/opjit.h as it is
# (tests/abi_host.c) runs unchanged on libopjit.so as built and on a
# libopjit.so.0 whose public structs have grown (target opjit_grown: the
# header as cmake/abi_grow.cmake makes it, fields added at the end of every
# struct a host hands in). The library must read and write only what the
# host's struct holds: bytes past it are guarded.
#
# Uses OPJIT_SHARED_LIB, OPJIT_GROWN_LIB (else skipped: exit 77),
# OPJIT_SOURCE_DIR, OPJIT_BINARY_DIR, OPJIT_TEST_TMP.
set -u
LIB=${OPJIT_SHARED_LIB:-}
GROWN=${OPJIT_GROWN_LIB:-}
if [ -z "$LIB" ] || [ -z "$GROWN" ]; then
    echo "libopjit.so or the grown one was not built (OPJIT_SHARED/OPJIT_ABI_TEST off): skipping"
    exit 77
fi
SRC=${OPJIT_SOURCE_DIR:?}
T=${OPJIT_TEST_TMP:?}
rm -rf "$T"
mkdir -p "$T"
CC=${OPJIT_CC:-cc}
command -v "$CC" >/dev/null 2>&1 || CC=cc
EXTRA_FLAGS=""
if grep -q '^OPJIT_SANITIZE:BOOL=ON' "${OPJIT_BINARY_DIR:-}/CMakeCache.txt" 2>/dev/null; then
    EXTRA_FLAGS="-fsanitize=address,undefined"
fi
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL $1"; return 1; fi; }
show() { sed 's/^/    | /' "$1" | tail -n 40; }

HOST=$T/abi_host
# shellcheck disable=SC2086
"$CC" $EXTRA_FLAGS -std=c11 -Wall -Wextra -Werror -I"$SRC/include" \
    ${OPJIT_DLPACK_INCLUDE_DIR:+-I"$OPJIT_DLPACK_INCLUDE_DIR"} -o "$HOST" "$SRC/tests/abi_host.c" \
    "$LIB" -Wl,-rpath,"$(dirname "$LIB")" >"$T/build.log" 2>&1
check "abi_host.c builds against include/opjit.h and libopjit.so" '[ $? = 0 ]' ||
    { show "$T/build.log"; exit 1; }
check "the grown library is another build of libopjit.so.0" \
    '[ "$(basename "$GROWN")" != "" ] && readelf -d "$GROWN" | grep -q "SONAME.*\[libopjit\.so\.0\]" && ! cmp -s "$GROWN" "$LIB"'

# The host as linked, then the same binary on the grown library.
for which in built grown; do
    dir=$(dirname "$LIB")
    [ $which = grown ] && dir=$(dirname "$GROWN")
    mkdir -p "$T/cache-$which"
    env -u OPJIT_CACHE_DIR LD_LIBRARY_PATH="$dir" OPJIT_OPS_PATH= "$HOST" "$T/cache-$which" \
        "$SRC/ops-src" >"$T/run-$which" 2>&1
    rc=$?
    check "the host runs on the $which library (exit $rc)" '[ $rc = 0 ]' || show "$T/run-$which"
done
# The same binary did load the grown copy (not the rpath's).
check "the run on the grown library used it" \
    'env LD_LIBRARY_PATH="$(dirname "$GROWN")" LD_DEBUG=libs "$HOST" 2>&1 | grep -q "calling init: $(dirname "$GROWN")/libopjit.so.0"'

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
