#!/usr/bin/env bash
# tests/test_cli_includes.sh - the opjit command is a client of opjit.h
# alone: every #include in tools/ names opjit.h, a header of tools/ itself,
# or a system header; never a header of the library's modules (cache/,
# loader/, runtime/, jit/, the generated build config). A host can do what
# the command does only if the command uses nothing a host cannot.
set -u
SRC=${OPJIT_SOURCE_DIR:?}
pass=0 fail=0
bad() { fail=$((fail + 1)); echo "FAIL $*"; }

shopt -s nullglob
files=("$SRC"/tools/*.c "$SRC"/tools/*.h)
[ ${#files[@]} -gt 0 ] || { echo "no files in $SRC/tools"; exit 1; }
for f in "${files[@]}"; do
    rel=${f#"$SRC"/}
    # Each include line: its delimiter and the path.
    while IFS= read -r line; do
        no=${line%%:*}
        inc=$(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*([<"][^>"]*[>"]).*/\1/p' <<<"${line#*:}")
        [ -n "$inc" ] || continue
        path=${inc:1:${#inc}-2}
        case "$inc" in
        \"*)
            if [ "$path" = opjit.h ] || { [[ $path == tools/*.h ]] && [ -f "$SRC/$path" ]; }; then
                pass=$((pass + 1))
            else
                bad "$rel:$no includes \"$path\": tools/ may include only \"opjit.h\" and tools/*.h"
            fi ;;
        *)
            if [[ $path =~ ^(cache|loader|runtime|jit|tools)/ || $path == opjit_build_config.h || $path == *_int.h ]]; then
                bad "$rel:$no includes <$path>: a library-internal header"
            else
                pass=$((pass + 1))
            fi ;;
        esac
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include' "$f")
done

# The check itself catches what it is for.
probe=$(mktemp)
printf '#include "loader/loader.h"\n' >"$probe"
if grep -qE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"(cache|loader|runtime|jit)/' "$probe"; then
    pass=$((pass + 1))
else
    bad "the include pattern misses a module header"
fi
rm -f "$probe"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
