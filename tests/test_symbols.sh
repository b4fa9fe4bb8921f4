#!/usr/bin/env bash
# tests/test_symbols.sh - nothing but opjit_* escapes the library: every
# global symbol libopjit.a and libopjit.so define is opjit_-prefixed, and a
# host that defines names the library uses inside (module_new, cache_open,
# schema_parse, rt_error) links against libopjit.a and runs.
#
# Env (set by ctest): OPJIT_BINARY_DIR, OPJIT_SOURCE_DIR, OPJIT_CC.
set -euo pipefail
B=${OPJIT_BINARY_DIR:?}
S=${OPJIT_SOURCE_DIR:?}
. "$(dirname "$0")/cli_lib.sh"
fresh_tmp
CC=${OPJIT_CC:-cc}
# A library built with sanitizers needs them at link time too.
EXTRA_FLAGS=
if grep -q '^OPJIT_SANITIZE:BOOL=ON' "$B/CMakeCache.txt" 2>/dev/null; then
    EXTRA_FLAGS="-fsanitize=address,undefined"
fi

others=$(nm -g --defined-only "$B/libopjit.a" | awk 'NF == 3 { print $3 }' | grep -v '^opjit_' || true)
check "libopjit.a defines only opjit_* globally (found: $(echo $others | head -c 300))" test -z "$others"
count=$(nm -g --defined-only "$B/libopjit.a" | awk 'NF == 3 { print $3 }' | grep -c '^opjit_' || true)
check "libopjit.a exports the API ($count symbols)" test "$count" -ge 20
if [[ -e "$B/libopjit.so" ]]; then
    others=$(nm -D --defined-only "$B/libopjit.so" | awk 'NF == 3 { print $3 }' | grep -v '^opjit_' || true)
    check "libopjit.so exports only opjit_* (found: $(echo $others | head -c 300))" test -z "$others"
fi

# What is exported is what the public headers declare, and each is spelled
# once (opjit.h, "Names"): no opjit_get_* beside the opjit_*_get getters.
declared=$(cat "$S/include/opjit.h" "$S/include/opjit_admin.h" |
    grep -oE '\bopjit_[a-z0-9_]+\(' | tr -d '(' | sort -u)
exported=$(nm -g --defined-only "$B/libopjit.a" | awk 'NF == 3 && $2 == "T" { print $3 }' | sort -u)
undeclared=$(comm -13 <(echo "$declared") <(echo "$exported") | grep -v '^opjit_module_init$' || true)
check "every exported function is declared in opjit.h or opjit_admin.h (not: $(echo $undeclared | head -c 300))" \
    test -z "$undeclared"
missing=$(comm -23 <(grep -hoE '^[a-z].*\bopjit_[a-z0-9_]+\(' "$S/include/opjit.h" "$S/include/opjit_admin.h" |
    grep -v '^static' | grep -oE 'opjit_[a-z0-9_]+\($' | tr -d '(' | sort -u) <(echo "$exported") || true)
check "every function they declare is exported (not: $(echo $missing | head -c 300))" test -z "$missing"
oldnames=$(echo "$exported" | grep -E '^opjit_get_|^opjit_op_arg$' || true)
check "getters are spelled opjit_<thing>_get (found: $(echo $oldnames))" test -z "$oldnames"
admin_in_core=$(grep -oE '\bopjit_(cache|warm|discover|sources|dtype|ops_path|parse_size)[a-z_]*\(' \
    "$S/include/opjit.h" | sort -u || true)
check "the admin API lives in opjit_admin.h, not opjit.h (found: $(echo $admin_in_core))" \
    test -z "$admin_in_core"

cat >"$T/host.c" <<'C'
#include <stdio.h>
#include <opjit.h>
/* Names the library uses inside: a host may have its own. */
int module_new(void) { return 41; }
int cache_open(void) { return 1; }
int schema_parse(void) { return 0; }
int rt_error(void) { return 0; }
int main(void)
{
    opjit_runtime *rt = NULL;
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = 0;
    if (opjit_create(&cfg, &rt) != OPJIT_OK)
        return 2;
    opjit_destroy(rt);
    printf("%d %s\n", module_new() + cache_open() + schema_parse() + rt_error(),
           opjit_version_string());
    return 0;
}
C
run "$CC" $EXTRA_FLAGS -o "$T/host" "$T/host.c" -I"$S/include" "$B/libopjit.a" -ltcc -lxxhash -ldl -lpthread -lm
expect "a host defining module_new, cache_open... links with libopjit.a" 0
run "$T/host"
expect "  and runs" 0 "42 0."

echo "test_symbols: $passed passed, $failed failed"
[[ $failed == 0 ]]
