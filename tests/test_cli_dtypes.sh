#!/usr/bin/env bash
# tests/test_cli_dtypes.sh - one dtype table for the runtime and the .npy
# files of the `opjit` command: float16 ('<f2') and uint16..uint64 go in and
# out of `opjit call`, are printed as numpy prints them, and are named the
# same in the runtime's errors; bfloat16 (which numpy has no name for) is
# printed but cannot be saved.
#
# Env (set by ctest): OPJIT_CLI, OPJIT_TEST_TMP, OPJIT_CACHE_DIR.
set -euo pipefail

. "$(dirname "$0")/cli_lib.sh"
need_cli
fresh_tmp
mkdir -p "$T/ops"
export OPJIT_CACHE_DIR=${OPJIT_CACHE_DIR:-$T/cache}
export OPJIT_OPS_PATH=$T/ops


# qd_copy: its input, for 2-, 4- and 8-byte integer and float dtypes.
# qd_bf16: float32 in, bfloat16 out (the top half of each float).
cat >"$T/ops/qd_copy.c" <<'EOF'
#include <opjit_op.h>
#include <string.h>
static int copy(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    DLTensor *y = opjit_output(ctx, 0, x->dtype, x->ndim, x->shape);
    if (!y)
        return -1;
    memcpy(y->data, opjit_data(x), (size_t)opjit_numel(x) * (x->dtype.bits / 8));
    return 0;
}
OPJIT_MODULE(qd_copy, m)
{
    opjit_def(m, "qd_copy(Tensor x) -> Tensor", OPJIT_CPU, copy, "x");
    opjit_require(m, "x", "float16|uint16|uint32|uint64|int16 contiguous");
}
EOF
cat >"$T/ops/qd_bf16.c" <<'EOF'
#include <opjit_op.h>
#include <string.h>
static int bf(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    DLDataType bf16 = {kDLBfloat, 16, 1};
    DLTensor *y = opjit_output(ctx, 0, bf16, x->ndim, x->shape);
    if (!y)
        return -1;
    const unsigned char *s = opjit_data(x);
    unsigned char *d = y->data;
    for (int64_t i = 0; i < opjit_numel(x); i++)
        memcpy(d + 2 * i, s + 4 * i + 2, 2);
    return 0;
}
OPJIT_MODULE(qd_bf16, m)
{
    opjit_def(m, "qd_bf16(Tensor x) -> Tensor", OPJIT_CPU, bf, "x as bfloat16");
    opjit_require(m, "x", "float32 contiguous");
}
EOF

# float16: 0.1 (0x2e66), 1.5 (0x3e00), -2 (0xc000)
npy "$T/h.npy" '<f2' "(3,)" "$(le 2 0x2e66)$(le 2 0x3e00)$(le 2 0xc000)"
run "$CLI" call qd_copy x=@"$T/h.npy"
expect "float16 in and printed" 0 "output 0: shape (3,), dtype float16"
check "float16 printed as numpy does" grep -qxF "[ 0.1  1.5 -2. ]" "$T/out"
run "$CLI" call qd_copy x=@"$T/h.npy" --out "$T/h2.npy"
expect "float16 saved" 0 "dtype float16 -> $T/h2.npy"
check "float16 saved as '<f2'" grep -qaF "'descr': '<f2'" "$T/h2.npy"
check "float16 saved bytes" test "$(npy_data_hex "$T/h2.npy")" = "$(npy_data_hex "$T/h.npy")"

# unsigned integers
npy "$T/u2.npy" '<u2' "(2,)" "$(le 2 65535)$(le 2 7)"
run "$CLI" call qd_copy x=@"$T/u2.npy"
expect "uint16" 0 "dtype uint16"
check "uint16 values" grep -qxF "[65535     7]" "$T/out"
npy "$T/u8.npy" '<u8' "(1,)" "$(le 8 4294967296)"
run "$CLI" call qd_copy x=@"$T/u8.npy"
expect "uint64" 0 "dtype uint64"
check "uint64 value" grep -qxF "[4294967296]" "$T/out"

# The runtime names the dtypes as the .npy reader does.
npy_i64 "$T/i8.npy" "(2,)" 1 2
run "$CLI" call qd_copy x=@"$T/i8.npy"
expect "a dtype the op does not take" 1 "" "expected dtype float16 or uint16 or uint32 or uint64 or int16, got int64"

# bfloat16: printed, not saved.
npy_f32 "$T/f.npy" "(3,)" 1 -2 3
run "$CLI" call qd_bf16 x=@"$T/f.npy"
expect "bfloat16 printed" 0 "output 0: shape (3,), dtype bfloat16"
check "bfloat16 values" grep -qxF "[ 1. -2.  3.]" "$T/out"
run "$CLI" call qd_bf16 x=@"$T/f.npy" --out "$T/bf.npy"
expect "bfloat16 cannot be saved" 1 "" "cannot save dtype"

# A .npy dtype numpy has and opjit does not: the error lists what is supported.
npy "$T/c8.npy" '<c8' "(1,)" "$(le 8 0)"
run "$CLI" call qd_copy x=@"$T/c8.npy"
expect "complex64 is refused" 1 "" "supported: float32 '<f4', float64 '<f8', float16 '<f2'"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
