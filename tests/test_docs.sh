#!/usr/bin/env bash
# tests/test_docs.sh - every code block of README.md and docs/*.md is
# compiled and run, written where a later block uses it, or says why not
# (tests/docs_check.py). Needs libopjit.so and the Python package; in a
# sanitizer build the pages are left to the normal build (exit 77).
#
# Env (set by ctest): OPJIT_SOURCE_DIR, OPJIT_BINARY_DIR, OPJIT_SHARED_LIB,
# OPJIT_DLPACK_INCLUDE_DIR, OPJIT_CC.
set -euo pipefail
: "${OPJIT_SOURCE_DIR:?}" "${OPJIT_BINARY_DIR:?}"
if [[ -z "${OPJIT_SHARED_LIB:-}" ]]; then
    echo "no libopjit.so in this build: skipping" >&2
    exit 77
fi
if grep -qE '^OPJIT_(SANITIZE|TSAN):BOOL=ON' "$OPJIT_BINARY_DIR/CMakeCache.txt"; then
    echo "a sanitizer build: the pages are checked in the normal build" >&2
    exit 77
fi
exec python3 "$OPJIT_SOURCE_DIR/tests/docs_check.py" "$OPJIT_SOURCE_DIR" "$OPJIT_BINARY_DIR"
