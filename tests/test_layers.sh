#!/usr/bin/env bash
# tests/test_layers.sh - the modules depend one way (docs/architecture.md):
#   tools/, samples/, python/ -> include/opjit.h, opjit_admin.h
#   loader/ -> jit/, cache/ -> runtime/
# A file may include headers of its own module and of the modules below
# it, never of one above. Fails naming each include that points up.
#
# Env (set by ctest): OPJIT_SOURCE_DIR.
set -euo pipefail
S=${OPJIT_SOURCE_DIR:?}
cd "$S"

# module: the modules whose headers it may include ("" : none but include/)
declare -A allowed=(
    [runtime]="runtime"
    [jit]="jit runtime"
    [cache]="cache runtime"
    [loader]="loader jit cache runtime"
    [tools]="tools"
    [samples]=""
    [python]=""
)
bad=0
for module in "${!allowed[@]}"; do
    [[ -d $module ]] || continue
    while IFS= read -r line; do
        file=${line%%:*}
        target=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$line")
        ok=0
        for a in ${allowed[$module]}; do
            [[ $target == "$a" ]] && ok=1
        done
        if [[ $ok == 0 ]]; then
            echo "FAIL: $line: $module/ may not include $target/ (it is not below $module/)" >&2
            bad=$((bad + 1))
        fi
    done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[a-z_]+/' "$module" \
                 --include='*.c' --include='*.h' || true)
done
# Clients of the library (tools/, samples/, python/) see opjit.h and
# opjit_admin.h alone: no generated or private header without a module
# directory either (their own headers, beside the file that includes them,
# are fine).
for module in tools samples python; do
    [[ -d $module ]] || continue
    while IFS= read -r line; do
        file=${line%%:*}
        header=$(sed -E 's/.*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/' <<<"$line")
        [[ -e "$(dirname "$file")/$header" ]] && continue # its own header, beside it
        echo "FAIL: $line: $module/ is a client of opjit.h and opjit_admin.h only" >&2
        bad=$((bad + 1))
    done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^/"]+"' "$module" \
                 --include='*.c' --include='*.h' | grep -vE '"opjit(_op|_admin)?\.h"' || true)
done
echo "test_layers: $bad include(s) pointing up"
[[ $bad == 0 ]]
