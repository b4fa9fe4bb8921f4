#!/bin/bash
# tests/test_pip_install.sh - the Python package as pip users get it: the
# wheel pyproject.toml builds (scikit-build-core over the CMake build),
# installed into fresh virtual environments, runs the README's pip block
# from another directory with no PYTHONPATH or OPJIT_OPS_PATH: its ops
# come from inside the wheel, importlib.metadata knows its version, and
# the stubs are there. Then Debian's python3 installs the same wheel.
#
# The wheel is built once, without pip's build isolation (which would
# fetch scikit-build-core from the package index every time), by the
# reusable build environment scripts/install-deps makes
# (~/.cache/opjit-dev/build-venv, or $OPJIT_BUILD_VENV), whose wheels/
# holds the NumPy wheel the fresh environments install offline. In the
# README's block, `v/bin/pip install .` becomes the install of that wheel;
# the block is otherwise run as written.
#
# Uses OPJIT_SOURCE_DIR, OPJIT_BINARY_DIR and OPJIT_TEST_TMP.
set -u
: "${OPJIT_SOURCE_DIR:?}" "${OPJIT_BINARY_DIR:?}" "${OPJIT_TEST_TMP:?}"
SRC=$OPJIT_SOURCE_DIR
T=$OPJIT_TEST_TMP
BV=${OPJIT_BUILD_VENV:-$HOME/.cache/opjit-dev/build-venv}
if grep -Eq '^OPJIT_(SANITIZE|TSAN):BOOL=ON' "$OPJIT_BINARY_DIR/CMakeCache.txt" 2>/dev/null; then
    echo "a sanitizer build: the wheel (built with its own flags) is tested by the normal build"
    exit 77
fi
if ! "$BV/bin/python" -c 'import scikit_build_core' 2>/dev/null; then
    echo "no build environment with scikit-build-core at $BV: run scripts/install-deps"
    exit 77
fi
rm -rf "$T"
mkdir -p "$T/elsewhere"
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL $1"; return 1; fi; }
show() { [ -f "$1" ] && sed 's/^/    | /' "$1" | tail -n 40; }

# Fresh environments see nothing of the build tree or the test settings.
unset PYTHONPATH OPJIT_OPS_PATH PYTHONHOME VIRTUAL_ENV
export OPJIT_CACHE_DIR="$T/cache" PIP_DISABLE_PIP_VERSION_CHECK=1

"$BV/bin/python" -m pip wheel --no-build-isolation --no-deps -w "$T/wheels" "$SRC" \
    >"$T/wheel.log" 2>&1
rc=$?
WHL=$(ls "$T"/wheels/opjit-*.whl 2>/dev/null | head -n 1)
check "pip wheel builds the wheel (exit $rc)" '[ $rc = 0 ] && [ -n "$WHL" ]' || { show "$T/wheel.log"; exit 1; }
"$BV/bin/python" -m zipfile -l "$WHL" >"$T/contents.txt"
for f in opjit/__init__.py opjit/__init__.pyi opjit/py.typed opjit/_log.py opjit/_inline.py \
         opjit/lib/libopjit.so.0 opjit/include/opjit.h opjit/include/opjit_op.h \
         opjit/share/opjit/ops/nms.c opjit/share/opjit/ops/nms_common.h; do
    check "the wheel holds $f" 'grep -q "^$f " "$T/contents.txt"' || show "$T/contents.txt"
done
check "the wheel holds the extension" 'grep -Eq "^opjit/_opjit\..*\.so " "$T/contents.txt"'
check "and no static library, test or build file" \
    '! grep -Eq "libopjit\.a|/tests?/|CMakeCache|libopjit\.so\.[0-9]+\.[0-9]" "$T/contents.txt"' ||
    show "$T/contents.txt"

# NumPy from the wheel kept by install-deps (else from the index).
FIND=(--find-links "$T/wheels")
if ls "$BV"/wheels/numpy-*.whl >/dev/null 2>&1; then
    FIND+=(--no-index --find-links "$BV/wheels")
fi

# The README's block, in a fresh environment of the build environment's
# interpreter, run from another directory.
# The README's sh block that runs `v/bin/pip install .`.
awk '/^```sh$/{b=""; g=1; next} g && /^```$/{if (b ~ /v\/bin\/pip install \./) {printf "%s", b; exit} g=0; next}
     g {b = b $0 "\n"}' "$SRC/README.md" >"$T/block.sh"
check "the README has the pip block" 'grep -q "v/bin/pip install \." "$T/block.sh"' || exit 1
VERSION=$(sed -n 's/^project(opjit VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")

run_block() { # interpreter, environment directory name, log
    local py=$1 v=$2 log=$3
    "$py" -m venv "$T/elsewhere/$v" || return 1
    sed -e "s#python3 -m venv v && ##" -e "s#v/bin/#$v/bin/#g" \
        -e "s#$v/bin/pip install \.#$v/bin/pip install -q ${FIND[*]} opjit#" \
        "$T/block.sh" >"$T/block-$v.sh"
    (cd "$T/elsewhere" && bash -e "$T/block-$v.sh") >"$log" 2>&1
}
run_block "$BV/bin/python" v "$T/run.log"
rc=$?
check "the README's pip block prints [2. 2. 2.] (exit $rc)" \
    '[ $rc = 0 ] && grep -Fq "[2. 2. 2.]" "$T/run.log"' || show "$T/run.log"
PY="$T/elsewhere/v/bin/python"
(cd "$T/elsewhere" && "$PY" -c '
import importlib.metadata as md, os, opjit
print("version", md.version("opjit"))
print("package", os.path.dirname(opjit.__file__))
print("nms", opjit.load_op("nms").sources["cpu"])
print("typed", os.path.isfile(os.path.join(os.path.dirname(opjit.__file__), "py.typed")))
') >"$T/meta.log" 2>&1
check "importlib.metadata.version(\"opjit\") is CMake's $VERSION" \
    'grep -qx "version $VERSION" "$T/meta.log"' || show "$T/meta.log"
check "the package is the installed one" \
    'grep -q "^package $T/elsewhere/v/lib/python3[.0-9]*/site-packages/opjit$" "$T/meta.log"' ||
    show "$T/meta.log"
check "nms comes from the ops inside the wheel" \
    'grep -q "^nms $T/elsewhere/v/lib/python3[.0-9]*/site-packages/opjit/share/opjit/ops/nms.c$" "$T/meta.log"' ||
    show "$T/meta.log"
check "py.typed is installed" 'grep -qx "typed True" "$T/meta.log"'

# An unwritable cache warns through logging in the installed package too.
(cd "$T/elsewhere" && OPJIT_CACHE_DIR=/proc/opjit-nowhere "$PY" -c '
import opjit; opjit.load_op("nms")') >"$T/warn.log" 2>&1
check "an unusable cache warns on stderr" 'grep -q "is unusable" "$T/warn.log"' || show "$T/warn.log"

# Debian's python3: the same CPython version takes the same wheel.
DEB=/usr/bin/python3
if [ -x "$DEB" ] && [ "$("$DEB" -c 'import sys; print(sys.version_info[:2])')" = \
                      "$("$BV/bin/python" -c 'import sys; print(sys.version_info[:2])')" ]; then
    run_block "$DEB" vd "$T/run-debian.log"
    rc=$?
    check "Debian's python3 runs the block from the same wheel (exit $rc)" \
        '[ $rc = 0 ] && grep -Fq "[2. 2. 2.]" "$T/run-debian.log"' || show "$T/run-debian.log"
else
    echo "skip Debian's python3: not the build environment's Python version"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
