#!/bin/bash
# tests/test_install.sh - install opjit into a prefix, then build a small
# host application against the installed copy two ways (CMake's
# find_package and pkg-config), against libopjit.a and, when it was built,
# libopjit.so, run them on the installed ops, and run the installed
# command-line tool. Last, the prefix moves: the installed tool and a host of
# libopjit.so still find the installed ops, with no OPJIT_OPS_PATH.
#
# Needs: cmake (else skipped: exit 77), a C compiler, pkg-config for the
# pkg-config part. Uses OPJIT_BINARY_DIR (the build to install),
# OPJIT_SHARED_LIB (set when libopjit.so was built) and OPJIT_TEST_TMP
# (scratch, wiped first).
set -u

if ! command -v cmake >/dev/null 2>&1; then
    echo "cmake not found: skipping"
    exit 77
fi
: "${OPJIT_BINARY_DIR:?OPJIT_BINARY_DIR must name the build directory}"
: "${OPJIT_TEST_TMP:?OPJIT_TEST_TMP must name a scratch directory}"

passed=0
failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() {
    echo "FAIL $1"
    failed=$((failed + 1))
    if [ -n "${2:-}" ] && [ -f "$2" ]; then
        sed 's/^/    | /' "$2" | tail -n 40
    fi
}
finish() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit $?
}

T=$OPJIT_TEST_TMP
rm -rf "$T"
mkdir -p "$T"
PREFIX=$T/prefix
CC=${OPJIT_CC:-cc}
command -v "$CC" >/dev/null 2>&1 || CC=cc

# A library built with sanitizers needs them at link time too.
EXTRA_FLAGS=""
if grep -q '^OPJIT_SANITIZE:BOOL=ON' "$OPJIT_BINARY_DIR/CMakeCache.txt" 2>/dev/null; then
    EXTRA_FLAGS="-fsanitize=address,undefined"
fi

# ---- install ------------------------------------------------------------------
if cmake --install "$OPJIT_BINARY_DIR" --prefix "$PREFIX" >"$T/install.log" 2>&1; then
    ok "cmake --install"
else
    bad "cmake --install" "$T/install.log"
    finish
fi

for f in include/opjit.h include/opjit_admin.h include/opjit_op.h bin/opjit share/opjit/ops/mm.c; do
    if [ -e "$PREFIX/$f" ]; then ok "installed $f"; else bad "installed $f (missing)"; fi
done

# The library directory: lib, lib64 or lib/<multiarch>, whatever GNUInstallDirs chose.
LIB=$(find "$PREFIX" -name libopjit.a -print 2>/dev/null | head -n 1)
if [ -n "$LIB" ]; then
    LIBDIR=$(dirname "$LIB")
    ok "installed libopjit.a (in ${LIBDIR#"$PREFIX"/})"
else
    LIBDIR=$PREFIX/lib
    bad "installed libopjit.a (not found under $PREFIX)"
fi
SHARED=0
if [ -n "${OPJIT_SHARED_LIB:-}" ]; then
    SHARED=1
    for f in libopjit.so libopjit.so.0 libopjit.so.0.1.0; do
        if [ -e "$LIBDIR/$f" ]; then ok "installed $f"; else bad "installed $f (missing in $LIBDIR)"; fi
    done
fi
for f in cmake/opjit/opjitConfig.cmake cmake/opjit/opjitConfigVersion.cmake pkgconfig/opjit.pc pkgconfig/opjit-static.pc; do
    if [ -e "$LIBDIR/$f" ]; then ok "installed ${LIBDIR#"$PREFIX"/}/$f"; else bad "installed $f (missing in $LIBDIR)"; fi
done

# Nothing of the build tree leaks into the installed package files.
if grep -rqs -- "$OPJIT_BINARY_DIR" "$LIBDIR/cmake/opjit" "$LIBDIR/pkgconfig"; then
    bad "installed package files do not mention the build directory"
    grep -rn -- "$OPJIT_BINARY_DIR" "$LIBDIR/cmake/opjit" "$LIBDIR/pkgconfig" | head -n 5
else
    ok "installed package files do not mention the build directory"
fi

# ---- the installed tool ---------------------------------------------------------
if "$PREFIX/bin/opjit" --version >"$T/version.out" 2>&1; then
    if grep -q '0\.1\.0\|[0-9]\+\.[0-9]\+\.[0-9]\+' "$T/version.out"; then
        ok "opjit --version ($(head -n 1 "$T/version.out"))"
    else
        bad "opjit --version prints a version" "$T/version.out"
    fi
else
    bad "opjit --version runs" "$T/version.out"
fi

# ---- a host application ------------------------------------------------------------
APP=$T/consumer
mkdir -p "$APP"
cat >"$APP/app.c" <<'EOF'
/* A host application: loads mm by name from the installed ops and
 * multiplies two 2x2 matrices; asks where the cache is (opjit_admin.h). */
#include <opjit.h>
#include <opjit_admin.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    if (opjit_version() != OPJIT_VERSION_NUMBER) {
        fprintf(stderr, "header %d, library %d\n", OPJIT_VERSION_NUMBER, opjit_version());
        return 1;
    }
    opjit_runtime *rt = NULL;
    int rc = opjit_create(NULL, &rt);
    if (rc) {
        fprintf(stderr, "opjit_create: %s\n", opjit_status_name(rc));
        return 1;
    }
    opjit_cache_info ci = {.size = sizeof ci};
    if ((rc = opjit_cache_info_get(rt, &ci))) {
        fprintf(stderr, "opjit_cache_info_get: %s\n", opjit_errmsg(rt));
        opjit_destroy(rt);
        return 1;
    }
    opjit_op *op = NULL;
    rc = opjit_load_op(rt, "mm", &op);
    if (rc) {
        fprintf(stderr, "load mm: %s: %s\n", opjit_status_name(rc), opjit_errmsg(rt));
        opjit_destroy(rt);
        return 1;
    }
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
    int64_t shape[2] = {2, 2};
    DLTensor ta = {a, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, NULL, 0};
    DLTensor tb = ta;
    tb.data = b;
    opjit_value args[2] = {opjit_tensor(&ta), opjit_tensor(&tb)};
    DLManagedTensor *out = NULL;
    rc = opjit_call(rt, op, args, 2, &out, 1);
    if (rc) {
        fprintf(stderr, "mm: %s: %s\n", opjit_status_name(rc), opjit_errmsg(rt));
        opjit_destroy(rt);
        return 1;
    }
    const DLTensor *o = &out->dl_tensor;
    const float want[4] = {19, 22, 43, 50};
    int good = o->ndim == 2 && o->shape[0] == 2 && o->shape[1] == 2 &&
               o->dtype.code == kDLFloat && o->dtype.bits == 32;
    const float *r = (const float *)((const char *)o->data + o->byte_offset);
    for (int i = 0; good && i < 4; i++)
        good = r[i] == want[i];
    printf("mm: [[%g, %g], [%g, %g]]\n", good ? r[0] : -1, good ? r[1] : -1, good ? r[2] : -1,
           good ? r[3] : -1);
    out->deleter(out);
    opjit_destroy(rt);
    if (!good) {
        fprintf(stderr, "mm gave the wrong result\n");
        return 1;
    }
    return 0;
}
EOF
cat >"$APP/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.18)
project(opjit_consumer C)
option(WANT_SHARED "" OFF)
if(WANT_SHARED)
  find_package(opjit REQUIRED COMPONENTS shared static)
else()
  find_package(opjit REQUIRED COMPONENTS static)
endif()
add_executable(app app.c)
target_link_libraries(app opjit::opjit)
add_executable(app_static app.c)
target_link_libraries(app_static opjit::opjit_static)
EOF

needs_so() { readelf -d "$1" 2>/dev/null | grep -q 'NEEDED.*\[libopjit\.so\.0\]'; }

# run_app NAME BINARY: mm from the installed ops, found with no
# OPJIT_OPS_PATH (the library knows where it was installed).
run_app() {
    local name=$1 bin=$2
    if env -u OPJIT_OPS_PATH OPJIT_CACHE_DIR="$T/cache" OPJIT_TIERING=0 \
        "$bin" >"$T/run.log" 2>&1 && grep -q 'mm: \[\[19, 22\], \[43, 50\]\]' "$T/run.log"; then
        ok "$name: runs mm from the installed ops, no OPJIT_OPS_PATH"
    else
        bad "$name: runs mm from the installed ops, no OPJIT_OPS_PATH" "$T/run.log"
    fi
}

# cmake_hosts PREFIX TAG: find_package + the exported targets, built and run.
cmake_hosts() {
    local prefix=$1 tag=$2 dir=$APP/build-$2
    if cmake -S "$APP" -B "$dir" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Debug \
        -DWANT_SHARED=$([ $SHARED = 1 ] && echo ON || echo OFF) \
        -DCMAKE_C_COMPILER="$CC" -DCMAKE_C_FLAGS="$EXTRA_FLAGS" \
        -DCMAKE_EXE_LINKER_FLAGS="$EXTRA_FLAGS" >"$T/cmake-configure-$tag.log" 2>&1; then
        ok "cmake consumer ($tag): find_package(opjit COMPONENTS ...)"
    else
        bad "cmake consumer ($tag): find_package(opjit COMPONENTS ...)" "$T/cmake-configure-$tag.log"
        return
    fi
    if ! cmake --build "$dir" >"$T/cmake-build-$tag.log" 2>&1; then
        bad "cmake consumer ($tag): builds" "$T/cmake-build-$tag.log"
        return
    fi
    ok "cmake consumer ($tag): builds against opjit::opjit and opjit::opjit_static"
    if [ $SHARED = 1 ] && ! needs_so "$dir/app"; then
        bad "cmake consumer ($tag): opjit::opjit is libopjit.so"
    fi
    if needs_so "$dir/app_static"; then
        bad "cmake consumer ($tag): opjit::opjit_static is libopjit.a (the app needs libopjit.so)"
    fi
    run_app "cmake consumer, opjit::opjit ($tag)" "$dir/app"
    run_app "cmake consumer, opjit::opjit_static ($tag)" "$dir/app_static"
}

# pkg_hosts PREFIX LIBDIR TAG: pkg-config opjit (the usual library) and
# opjit-static, built and run.
pkg_hosts() {
    local prefix=$1 libdir=$2 tag=$3 flags
    command -v pkg-config >/dev/null 2>&1 || { echo "pkg-config not found: skipped"; return; }
    if ! flags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs opjit-static 2>"$T/pc-$tag.log"); then
        bad "pkg-config finds opjit-static ($tag)" "$T/pc-$tag.log"
        return
    fi
    ok "pkg-config opjit-static ($tag): $flags"
    for f in $flags; do
        case $f in
        /*) [[ $f == "$prefix"/* ]] || bad "pkg-config opjit-static names $f, outside the prefix" ;;
        esac
    done
    # As make (or meson, or CMake) passes it on: through the shell's quoting.
    if eval "\"\$CC\" \$EXTRA_FLAGS -o \"\$APP/app_pc_\$tag\" \"\$APP/app.c\" $flags" \
        >"$T/pc-build-$tag.log" 2>&1 &&
        ! needs_so "$APP/app_pc_$tag"; then
        ok "pkg-config consumer ($tag): builds against libopjit.a"
        run_app "pkg-config consumer, static ($tag)" "$APP/app_pc_$tag"
    else
        bad "pkg-config consumer ($tag): builds against libopjit.a" "$T/pc-build-$tag.log"
    fi
    [ $SHARED = 1 ] || return 0
    flags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs opjit 2>>"$T/pc-$tag.log")
    if eval "\"\$CC\" \$EXTRA_FLAGS -o \"\$APP/app_pc_shared_\$tag\" \"\$APP/app.c\" $flags" \
        '-Wl,-rpath,"$libdir"' >"$T/pc-shared-build-$tag.log" 2>&1 && needs_so "$APP/app_pc_shared_$tag"; then
        ok "pkg-config consumer ($tag): builds against libopjit.so ($flags)"
        run_app "pkg-config consumer, shared ($tag)" "$APP/app_pc_shared_$tag"
    else
        bad "pkg-config consumer ($tag): builds against libopjit.so" "$T/pc-shared-build-$tag.log"
    fi
}

cmake_hosts "$PREFIX" installed
pkg_hosts "$PREFIX" "$LIBDIR" installed

# The shipped sample, built against the installed package as a host would,
# finds nms among the installed ops, compiles it and runs it.
SAMPLE=$T/sample
mkdir -p "$SAMPLE"
cp "${OPJIT_SOURCE_DIR:?}/samples/nms_demo.c" "$SAMPLE/"
cat >"$SAMPLE/CMakeLists.txt" <<'EOF2'
cmake_minimum_required(VERSION 3.16)
project(opjit_sample C)
find_package(opjit REQUIRED)
add_executable(nms_demo nms_demo.c)
target_link_libraries(nms_demo opjit::opjit)
EOF2
if cmake -S "$SAMPLE" -B "$SAMPLE/build" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_C_COMPILER="$CC" \
    -DCMAKE_C_FLAGS="$EXTRA_FLAGS" -DCMAKE_EXE_LINKER_FLAGS="$EXTRA_FLAGS" >"$T/sample-configure.log" 2>&1 &&
    cmake --build "$SAMPLE/build" >"$T/sample-build.log" 2>&1; then
    ok "samples/nms_demo.c builds against the installed package"
    # This host lives outside the prefix: the ops next to it are not the
    # installed ones, so name them as a deployer would.
    if env OPJIT_OPS_PATH="$PREFIX/share/opjit/ops" OPJIT_CACHE_DIR="$T/sample-cache" OPJIT_TIERING=0 \
        "$SAMPLE/build/nms_demo" 500 0.5 >"$T/sample.run" 2>&1 &&
        grep -q '500 boxes, IoU threshold 0.50 -> kept [1-9]' "$T/sample.run"; then
        ok "the installed sample runs nms from the installed ops ($(grep -o 'kept [0-9]*' "$T/sample.run"))"
    else
        bad "the installed sample runs nms from the installed ops" "$T/sample.run"
    fi
else
    bad "samples/nms_demo.c builds against the installed package" "$T/sample-build.log"
fi

# The public headers are usable from C++ hosts too.
if command -v c++ >/dev/null 2>&1; then
    printf '#include <opjit.h>\n#include <opjit_admin.h>\nint main() { opjit_value v = opjit_int(3); return opjit_version() > 0 && v.u.i == 3 ? 0 : 1; }\n' \
        >"$APP/cxx.cc"
    if c++ -fsyntax-only -I"$PREFIX/include" "$APP/cxx.cc" >"$T/cxx.log" 2>&1; then
        ok "opjit.h and opjit_admin.h compile as C++"
    else
        bad "opjit.h and opjit_admin.h compile as C++" "$T/cxx.log"
    fi
fi

# ---- the prefix moves -----------------------------------------------------------------
# The installed tool (libopjit.a) and a host of libopjit.so find the ops
# relative to where they are, with no OPJIT_OPS_PATH.
MOVED=$T/moved
if mv "$PREFIX" "$MOVED"; then
    env -u OPJIT_OPS_PATH OPJIT_CACHE_DIR="$T/moved-cache" OPJIT_TIERING=0 \
        "$MOVED/bin/opjit" list >"$T/moved-list.run" 2>&1
    if grep -q '^nms(' "$T/moved-list.run" && grep -qF "$MOVED/share/opjit/ops/nms.c" "$T/moved-list.run"; then
        ok "moved prefix: the installed opjit lists nms from $MOVED/share/opjit/ops"
    else
        bad "moved prefix: the installed opjit lists nms from $MOVED/share/opjit/ops" "$T/moved-list.run"
    fi
    if [ $SHARED = 1 ] && [ -x "$APP/build-installed/app" ]; then
        if env -u OPJIT_OPS_PATH LD_LIBRARY_PATH="$MOVED/${LIBDIR#"$PREFIX"/}" OPJIT_CACHE_DIR="$T/moved-cache" \
            "$APP/build-installed/app" >"$T/moved-app.run" 2>&1 &&
            grep -q 'mm: \[\[19, 22\], \[43, 50\]\]' "$T/moved-app.run"; then
            ok "moved prefix: a host of libopjit.so runs mm from the moved ops"
        else
            bad "moved prefix: a host of libopjit.so runs mm from the moved ops" "$T/moved-app.run"
        fi
    fi
    # Hosts built against the tree where it is now, both libraries.
    cmake_hosts "$MOVED" moved
    pkg_hosts "$MOVED" "$MOVED/${LIBDIR#"$PREFIX"/}" moved
else
    bad "mv $PREFIX $MOVED"
fi

finish
