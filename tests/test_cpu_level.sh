#!/usr/bin/env bash
# tests/test_cpu_level.sh - OPJIT_CPU_LEVEL: the optimizing tier builds for
# the instruction set asked (its -march and the target in its key), never
# above the CPU's, so the AVX2 and portable kernels of conv2d.c and mm.c
# run on a CPU that has more (test_ops runs them against the references).
# Checked in what the artifacts hold: AVX-512 registers, AVX2 FMAs. A cache
# holding a lower level's code only serves it, and builds the best level.
# Env (set by ctest): OPJIT_CLI, OPJIT_OPS_PATH, OPJIT_TEST_TMP, OPJIT_CC.
set -euo pipefail

. "$(dirname "$0")/cli_lib.sh"
need_cli
fresh_tmp
OPS=${OPJIT_OPS_PATH:?OPJIT_OPS_PATH must name ops-src}
if [[ "$(uname -m)" != x86_64 ]] || ! command -v objdump >/dev/null ||
        ! command -v "${OPJIT_CC:-cc}" >/dev/null; then
    echo "needs x86-64, objdump and a C compiler; skipping" >&2
    exit 77
fi
unset OPJIT_OFFLINE OPJIT_CACHE_READONLY OPJIT_CPU_LEVEL
export OPJIT_TIERING=1
avx512=0
grep -qw avx512f /proc/cpuinfo && avx512=1
avx2=0
grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && avx2=1

# build LEVEL SOURCE: load SOURCE with OPJIT_CPU_LEVEL=LEVEL into a cache of
# its own, wait for the optimized code; $target and $asm (its disassembly).
build() {
    export OPJIT_CACHE_DIR="$T/cache-$1-$(basename "$2" .c)"
    run env OPJIT_CPU_LEVEL="$1" "$CLI" load --wait "$2"
    expect "OPJIT_CPU_LEVEL=$1: $2 loads" 0
    run env OPJIT_CPU_LEVEL="$1" "$CLI" cache why "$2"
    local line key
    line=$(grep -m1 ": opt .*: cached (key" "$T/out" || true)
    target=$(sed -n 's/.*: opt \([^:]*\): cached.*/\1/p' <<<"$line")
    key=$(sed -n 's/.*(key \([0-9a-f]*\)).*/\1/p' <<<"$line")
    asm="$T/$1.s"
    if [[ -n "$key" ]]; then
        objdump -d "$OPJIT_CACHE_DIR/v1/entries/${key:0:2}/$key/host.so" >"$asm"
    else
        fail "OPJIT_CPU_LEVEL=$1: no optimized artifact cached for $2"
        : >"$asm"
    fi
}

for src in "$OPS/mm.c" "$OPS/conv2d.c"; do
    if ((avx512)); then
        build "" "$src"
        check "no level: AVX-512 code for the AVX-512 CPU ($target)" \
            grep -q "vfmadd[0-9a-z]*ps.*%zmm" "$asm"
    fi
    if ((avx2)); then
        build avx2 "$src"
        check "avx2: built for x86-64-v3 ($target)" test "$target" = x86-64-v3
        check "  AVX2 fused multiply-adds" grep -q "vfmadd[0-9a-z]*ps.*%ymm" "$asm"
        check "  no AVX-512 register" sh -c "! grep -q '%zmm' '$asm'"
    fi
    build portable "$src"
    check "portable: built for x86-64 ($target)" test "$target" = x86-64
    check "  no AVX register, no FMA" sh -c "! grep -qE '%[yz]mm|vfmadd' '$asm'"
done

# A cache that holds optimized code for a lower level only (warmed on an
# older machine, or under OPJIT_CPU_LEVEL) serves it at once, and the best
# level this CPU runs is built in the background and swapped in.
best=
((avx2)) && best=x86-64-v3
((avx512)) && best=x86-64-v4
if [[ -n "$best" ]]; then
    export OPJIT_CACHE_DIR="$T/cache-upgrade"
    run env OPJIT_CPU_LEVEL=portable "$CLI" load --wait "$OPS/nms.c"
    expect "upgrade: the portable level's code cached first" 0
    run "$CLI" cache why "$OPS/nms.c"
    expect "upgrade: $best not cached yet" 0 "opt $best: not cached"
    run "$CLI" -v load --wait "$OPS/nms.c"
    expect "upgrade: the portable code serves at once, $best is swapped in" 0 "[opt]" \
        "code for $best now serves calls"
    run "$CLI" cache why "$OPS/nms.c"
    expect "upgrade: $best now cached" 0 "opt $best: cached"
    run "$CLI" -v load --wait "$OPS/nms.c"
    check "upgrade: the next process is served $best, nothing more built" \
        sh -c "grep -q 'opt ($best, [0-9a-f]*): local hit' '$T/err' && ! grep -q 'now serves' '$T/err'"
fi

# A level above the CPU's gives the CPU's; a word that is no level warns.
export OPJIT_CACHE_DIR="$T/cache-why"
run env OPJIT_CPU_LEVEL=avx512 "$CLI" cache why "$OPS/mm.c"
if ((avx512)); then
    expect "avx512 on an AVX-512 CPU" 0 "opt x86-64-v4:"
else
    check "avx512 on a CPU without it: not above the CPU" sh -c "! grep -q 'x86-64-v4' '$T/out'"
fi
run env OPJIT_CPU_LEVEL=sse9 "$CLI" cache why "$OPS/mm.c"
expect "an unknown level warns" 0 "" "OPJIT_CPU_LEVEL='sse9' is not avx512, avx2 or portable"

echo "test_cpu_level: $passed passed, $failed failed"
[[ $failed == 0 ]]
