#!/usr/bin/env bash
# tests/test_python_install.sh - the Python package as `cmake --install`
# leaves it: under <prefix>/<site dir>/opjit, exporting PyInit__opjit only,
# finding libopjit.so.0 through a relative RPATH and the installed ops
# through libopjit.so, so that from another directory and with no
# OPJIT_OPS_PATH the README's check works:
#   python3 -c 'import opjit, torch; print(opjit.load_op("nms")(...))'
# and still works after the prefix moves.
#
# Uses OPJIT_BINARY_DIR, OPJIT_TEST_TMP, and from tests/CMakeLists.txt
# OPJIT_PYTHON (the interpreter; unset: the package was not built, skip),
# OPJIT_PYTHON_INSTALL_DIR (site dir under the prefix) and OPJIT_PY_PRELOAD
# (sanitizer runtimes the interpreter needs in a sanitizer build).
set -u
PY=${OPJIT_PYTHON:-}
if [ -z "$PY" ]; then
    echo "the Python package was not built: skipping"
    exit 77
fi
: "${OPJIT_BINARY_DIR:?}" "${OPJIT_TEST_TMP:?}" "${OPJIT_PYTHON_INSTALL_DIR:?}"
T=$OPJIT_TEST_TMP
rm -rf "$T"
mkdir -p "$T/elsewhere"
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL $1"; return 1; fi; }
show() { [ -f "$1" ] && sed 's/^/    | /' "$1" | tail -n 30; }

# The installed interpreter run: from elsewhere, no OPJIT_OPS_PATH, only
# the installed package on its path.
py() {
    (cd "$T/elsewhere" && env -u OPJIT_OPS_PATH PYTHONPATH="$1" PYTHONDONTWRITEBYTECODE=1 \
        OPJIT_CACHE_DIR="$T/cache" ${OPJIT_PY_PRELOAD:+LD_PRELOAD="$OPJIT_PY_PRELOAD" ASAN_OPTIONS=detect_leaks=0} \
        "$PY" -c "$2")
}

cmake --install "$OPJIT_BINARY_DIR" --prefix "$T/prefix" >"$T/install.log" 2>&1
check "cmake --install" '[ $? = 0 ]' || { show "$T/install.log"; exit 1; }
case $OPJIT_PYTHON_INSTALL_DIR in
/*) SITE=$OPJIT_PYTHON_INSTALL_DIR ;;
*) SITE=$T/prefix/$OPJIT_PYTHON_INSTALL_DIR ;;
esac
MOD=$(ls "$SITE"/opjit/_opjit*.so 2>/dev/null | head -n 1)
check "the package is in $SITE/opjit" '[ -f "$SITE/opjit/__init__.py" ] && [ -n "$MOD" ]' || exit 1
check "the site directory is the interpreter's own, under the prefix" \
    '"$PY" -c "import sysconfig, os; p = sysconfig.get_path(\"platlib\"); print(p)" | grep -q "${OPJIT_PYTHON_INSTALL_DIR#/}\$"'
nm -D --defined-only "$MOD" | awk 'NF >= 3 { print $3 }' >"$T/exports"
check "the extension exports PyInit__opjit only" '[ "$(cat "$T/exports")" = PyInit__opjit ]' || show "$T/exports"
readelf -d "$MOD" >"$T/dynamic"
check "it needs libopjit.so.0 through a relative RUNPATH" \
    'grep -q "NEEDED.*libopjit\.so\.0" "$T/dynamic" && grep -q "R.*PATH.*\$ORIGIN" "$T/dynamic"' || show "$T/dynamic"

if "$PY" -c 'import torch' 2>/dev/null; then
    CHECK='import opjit, torch; print(opjit.load_op("nms")(torch.rand(100,4)*100, torch.rand(100), 0.5)); print(opjit.__file__)'
    WANT='^tensor\(\['
else
    CHECK='import opjit, numpy as np; print(opjit.load_op("nms")(np.random.rand(100,4).astype(np.float32)*100, np.random.rand(100).astype(np.float32), 0.5)); print(opjit.__file__)'
    WANT='^\['
fi
py "$SITE" "$CHECK" >"$T/run.log" 2>&1
rc=$?
check "the README's check runs from another directory, no OPJIT_OPS_PATH (exit $rc)" \
    '[ $rc = 0 ] && grep -Eq "$WANT" "$T/run.log"' || show "$T/run.log"
check "it imported the installed package" 'grep -q "^$SITE/opjit/__init__.py" "$T/run.log"' || show "$T/run.log"
py "$SITE" 'import opjit; op = opjit.load_op("nms"); print(op.sources["cpu"])' >"$T/src.log" 2>&1
check "nms came from the installed ops" 'grep -q "^$T/prefix/.*share/opjit/ops/nms.c" "$T/src.log"' || show "$T/src.log"

# The prefix moves: RUNPATH and the ops are relative.
mv "$T/prefix" "$T/moved"
rm -rf "$T/cache"
py "${SITE/$T\/prefix/$T/moved}" "$CHECK" >"$T/moved.log" 2>&1
rc=$?
check "after the prefix moves (exit $rc)" '[ $rc = 0 ] && grep -Eq "$WANT" "$T/moved.log"' || show "$T/moved.log"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
