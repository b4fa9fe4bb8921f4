#!/usr/bin/env bash
# tests/test_load_path.sh - a warm load stays short (#23): the library
# files whose code a cache hit of ops-src/nms.c runs, less the op's own
# init, are at most 12 (cache/ 4, jit/ 2, loader/ 4, runtime/ 2), and no
# call goes from a lower folder back up. scripts/load-path-files measures
# it under callgrind.
# Skipped (77) without valgrind, and in a build whose inlining differs from
# the release one (not RelWithDebInfo) or that is instrumented (sanitizers).
#
# Env (set by ctest): OPJIT_CLI, OPJIT_SOURCE_DIR, OPJIT_BINARY_DIR.
set -euo pipefail
. "$(dirname "$0")/cli_lib.sh"
need_cli
fresh_tmp
S=${OPJIT_SOURCE_DIR:?}
B=${OPJIT_BINARY_DIR:?}
if ! command -v valgrind >/dev/null; then
    echo "valgrind not installed (Debian package valgrind); skipping" >&2
    exit 77
fi
if ! grep -q '^CMAKE_BUILD_TYPE:[A-Z]*=RelWithDebInfo$' "$B/CMakeCache.txt" ||
    grep -q '^OPJIT_SANITIZE:[A-Z]*=ON$' "$B/CMakeCache.txt"; then
    echo "not a RelWithDebInfo build without sanitizers; skipping" >&2
    exit 77
fi
TMPDIR=$T "$S/scripts/load-path-files" "$B" "$S/ops-src/nms.c" >"$T/out" 2>"$T/err" || {
    cat "$T/err" >&2
    fail "scripts/load-path-files failed"
}
# The second block of the report: the load less the op's init.
files=$(sed -n "s/^library files .*less the op's init.*: \([0-9]*\)$/\1/p" "$T/out")
back=$(sed -n 's/^calls from a lower folder back up: \([0-9]*\)$/\1/p' "$T/out" | sort -n | tail -1)
if [[ -n $files && $files -le 12 ]]; then pass; else
    fail "a warm load less the init runs code of ${files:-?} library files (at most 12)"
    cat "$T/out" >&2
fi
if [[ $back == 0 ]]; then pass; else fail "calls back up: ${back:-?} (none expected)"; fi

echo "test_load_path: $passed passed, $failed failed"
[[ $failed == 0 ]]
