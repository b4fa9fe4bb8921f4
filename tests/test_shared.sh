#!/usr/bin/env bash
# tests/test_shared.sh - libopjit.so as built: it exports opjit_* and
# nothing else, has no text relocations, a host linked to it (samples/
# nms_demo.c) compiles nms.c on an empty cache with the libtcc inside it and
# runs it, and Python's ctypes loads it.
#
# Uses OPJIT_SHARED_LIB (set by tests/CMakeLists.txt when libopjit.so is
# built; else skipped: exit 77), OPJIT_SOURCE_DIR, OPJIT_BINARY_DIR,
# OPJIT_OPS_PATH, OPJIT_TEST_TMP.
set -u
LIB=${OPJIT_SHARED_LIB:-}
if [ -z "$LIB" ]; then
    echo "libopjit.so was not built (OPJIT_SHARED=OFF, or the static-only fallback): skipping"
    exit 77
fi
SRC=${OPJIT_SOURCE_DIR:?}
T=${OPJIT_TEST_TMP:?}
rm -rf "$T"
mkdir -p "$T"
CC=${OPJIT_CC:-cc}
command -v "$CC" >/dev/null 2>&1 || CC=cc
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL $1"; return 1; fi; }
show() { [ -f "$1" ] && sed 's/^/    | /' "$1" | tail -n 30; }

# A library built with sanitizers needs their runtimes in the host too.
EXTRA_FLAGS=""
SANITIZE=0
if grep -q '^OPJIT_SANITIZE:BOOL=ON' "${OPJIT_BINARY_DIR:-}/CMakeCache.txt" 2>/dev/null; then
    EXTRA_FLAGS="-fsanitize=address,undefined"
    SANITIZE=1
fi

# ---- (a) the exported symbols -------------------------------------------------------
nm -D --defined-only "$LIB" | awk 'NF >= 3 { print $3 }' | sed 's/@.*//' | sort -u >"$T/exports"
grep -v '^opjit_' "$T/exports" >"$T/foreign"
check "libopjit.so exports opjit_* only ($(wc -l <"$T/exports") symbols)" '[ ! -s "$T/foreign" ]' ||
    { echo "    exported besides opjit_*:"; sed 's/^/    | /' "$T/foreign" | head -n 40; }
check "libopjit.so exports opjit_create and opjit_call" \
    'grep -qx opjit_create "$T/exports" && grep -qx opjit_call "$T/exports"'
check "no libtcc symbol is visible (tcc_new)" '! nm -D "$LIB" | grep -qw tcc_new'

# ---- (b) no text relocations, the soname -----------------------------------------------
readelf -d "$LIB" >"$T/dynamic" 2>&1
check "readelf -d: no TEXTREL" '! grep -q TEXTREL "$T/dynamic"'
check "soname is libopjit.so.0" 'grep -q "SONAME.*\[libopjit\.so\.0\]" "$T/dynamic"'
check "full RELRO: bound at load, GOT read-only (BIND_NOW, GNU_RELRO)" \
    'grep -q "BIND_NOW" "$T/dynamic" && readelf -lW "$LIB" | grep -q GNU_RELRO'

# ---- (c) a host linked to libopjit.so compiles nms.c on an empty cache ---------------
DEMO=$T/nms_demo_shared
# shellcheck disable=SC2086
if "$CC" $EXTRA_FLAGS -I"$SRC/include" ${OPJIT_DLPACK_INCLUDE_DIR:+-I"$OPJIT_DLPACK_INCLUDE_DIR"} -o "$DEMO" "$SRC/samples/nms_demo.c" "$LIB" \
    -Wl,-rpath,"$(dirname "$LIB")" -lm >"$T/build.log" 2>&1; then
    check "samples/nms_demo.c builds against libopjit.so" true
    check "it needs libopjit.so.0 and holds no libtcc" \
        'readelf -d "$DEMO" | grep -q "NEEDED.*\[libopjit\.so\.0\]" && ! nm "$DEMO" | grep -qw tcc_new'
    CACHE=$(mktemp -d -p "$T" cache.XXXXXX)
    OPJIT_CACHE_DIR=$CACHE OPJIT_TIERING=0 "$DEMO" 2000 0.5 >"$T/run" 2>&1
    rc=$?
    check "it runs nms on an empty cache (exit $rc)" \
        '[ $rc = 0 ] && grep -q "2000 boxes, IoU threshold 0.50 -> kept [1-9]" "$T/run"' || show "$T/run"
    check "the libtcc in libopjit.so compiled nms.c into the cache" \
        '[ -n "$(find "$CACHE" -name host.so | head -n 1)" ]'
    # The same boxes as the static build keeps (the project's nms_demo).
    if [ -n "${OPJIT_NMS_DEMO:-}" ]; then
        OPJIT_CACHE_DIR=$(mktemp -d -p "$T" cache.XXXXXX) OPJIT_TIERING=0 "$OPJIT_NMS_DEMO" 2000 0.5 \
            >"$T/run-static" 2>&1
        check "it keeps the same boxes as the static build" \
            '[ "$(grep kept "$T/run")" = "$(grep kept "$T/run-static")" ]'
    fi
    # A compile error comes back as a message with file:line (libtcc's
    # diagnostics reach the callback, not stderr).
    mkdir -p "$T/bad"
    printf 'int x = ;\n' >"$T/bad/nms.c"
    OPJIT_OPS_PATH=$T/bad OPJIT_CACHE_DIR=$(mktemp -d -p "$T" cache.XXXXXX) OPJIT_TIERING=0 \
        "$DEMO" 10 >"$T/bad.run" 2>&1
    rc=$?
    check "a broken nms.c: exit 1 with libtcc's diagnostic, file:line (exit $rc)" \
        '[ $rc = 1 ] && grep -q "nms\.c:[0-9]*: error" "$T/bad.run"' || show "$T/bad.run"
else
    check "samples/nms_demo.c builds against libopjit.so" false
    show "$T/build.log"
fi

# ---- (d) Python's ctypes loads it -----------------------------------------------------------
PY=/usr/bin/python3
if [ ! -x "$PY" ]; then
    echo "no /usr/bin/python3: the ctypes part is skipped"
else
    want=$(sed -n 's/^project(opjit VERSION \([0-9]*\)\.\([0-9]*\)\.\([0-9]*\).*/\1 \2 \3/p' "$SRC/CMakeLists.txt" |
        awk '{ print $1 * 10000 + $2 * 100 + $3 }')
    PRELOAD=""
    if [ $SANITIZE = 1 ]; then
        # An instrumented library in an uninstrumented interpreter: the
        # runtimes must come first, and Python's own leaks are not ours.
        for rtlib in libasan.so libubsan.so; do
            f=$("$CC" -print-file-name=$rtlib)
            [ -e "$f" ] && PRELOAD="$PRELOAD${PRELOAD:+:}$f"
        done
    fi
    cat >"$T/smoke.py" <<'EOF'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.opjit_version.restype = ctypes.c_int
lib.opjit_version_string.restype = ctypes.c_char_p
lib.opjit_errmsg.restype = ctypes.c_char_p
print("version", lib.opjit_version(), lib.opjit_version_string().decode())
rt = ctypes.c_void_p()
rc = lib.opjit_create(None, ctypes.byref(rt))
if rc:
    sys.exit("opjit_create: %d" % rc)
op = ctypes.c_void_p()
rc = lib.opjit_load_op(rt, b"nms", ctypes.byref(op))
print("load nms", rc, (lib.opjit_errmsg(rt) or b"").decode())
lib.opjit_destroy(rt)
sys.exit(1 if rc else 0)
EOF
    env ${PRELOAD:+LD_PRELOAD=$PRELOAD} ${PRELOAD:+ASAN_OPTIONS=detect_leaks=0} \
        OPJIT_CACHE_DIR="$(mktemp -d -p "$T" cache.XXXXXX)" OPJIT_TIERING=0 \
        "$PY" "$T/smoke.py" "$LIB" >"$T/py.out" 2>&1
    rc=$?
    check "ctypes: opjit_version() is $want, and nms loads (exit $rc)" \
        '[ $rc = 0 ] && grep -q "^version $want " "$T/py.out" && grep -q "^load nms 0" "$T/py.out"' ||
        show "$T/py.out"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
