#!/usr/bin/env bash
# tests/test_cli.sh - the `opjit` command: help and usage errors, list, load,
# call (values in and out through .npy files), error messages, and the flow
# of an op author who drops a new source into a directory and calls it
# without rebuilding anything.
#
# Env (set by ctest): OPJIT_CLI (the built tool), OPJIT_OPS_PATH (the repo's
# ops-src), OPJIT_TEST_TMP (scratch), OPJIT_CACHE_DIR (a cache for this test).
# The .npy inputs are built with printf, so numpy is not needed; where
# /usr/bin/python3 has numpy, the outputs are also checked with numpy.
set -euo pipefail

. "$(dirname "$0")/cli_lib.sh"
need_cli
fresh_tmp
OPS=${OPJIT_OPS_PATH:?OPJIT_OPS_PATH must name ops-src}
export OPJIT_CACHE_DIR=${OPJIT_CACHE_DIR:-$T/cache}

HAVE_NUMPY=0
if /usr/bin/python3 -c 'import numpy' 2>/dev/null; then HAVE_NUMPY=1; fi

# --- help, version, usage errors ---------------------------------------------

run "$CLI" --version
expect "--version" 0 "opjit 0."

run "$CLI"
expect "no arguments" 2 "" "usage: opjit"
check "no arguments: nothing on stdout" test ! -s "$T/out"

for h in --help -h; do
    run "$CLI" $h
    expect "$h" 0 "usage: opjit"
done
run "$CLI" help
expect "help" 0 "usage: opjit"

# Every command the top-level help lists has its own --help.
commands=$("$CLI" --help | sed -n '/^commands:/,/^$/p' | awk 'NF && !/^commands:/ {print $1}' | grep -vx help)
for c in list load call; do
    check "--help lists $c" grep -qx "$c" <<<"$commands"
done
for cmd in $commands; do
    for h in --help -h; do
        run "$CLI" $cmd $h
        expect "$cmd $h" 0 "usage: opjit $cmd"
    done
    run "$CLI" help $cmd
    expect "help $cmd" 0 "usage: opjit $cmd"
    run "$CLI" --cache "$T/unused" $cmd --help
    expect "global option then $cmd --help" 0 "usage: opjit $cmd"
done

run "$CLI" frobnicate
expect "unknown command" 2 "" "unknown command 'frobnicate'"
run "$CLI" help frobnicate
expect "help unknown command" 2 "" "unknown command"
run "$CLI" --bogus list
expect "unknown global option" 2 "" "unknown option '--bogus'"
run "$CLI" --cache
expect "--cache without a value" 2 "" "--cache needs a value"
run "$CLI" list --ops-path
expect "--ops-path without a value" 2 "" "needs a value"
run "$CLI" list extra
expect "list with an argument" 2 "" "unexpected argument 'extra'"
run "$CLI" load
expect "load without files" 2 "" "no OP or FILE"
run "$CLI" load --bogus x.c
expect "load unknown option" 2 "" "unknown option '--bogus'"
run "$CLI" call
expect "call without an op" 2 "" "no operator"
run "$CLI" call mm justtext
expect "call without NAME=VALUE" 2 "" "expected NAME=VALUE, got 'justtext'"
run "$CLI" call mm =3
expect "call with an empty name" 2 "" "expected NAME=VALUE"
run "$CLI" call mm --device tpu
expect "call bad device" 2 "" "--device must be cpu or cuda"
run "$CLI" call mm --out
expect "call --out without a value" 2 "" "needs a value"
run "$CLI" call mm --frob
expect "call unknown option" 2 "" "unknown option '--frob'"

# --- list --------------------------------------------------------------------

run "$CLI" list
expect "list" 0 "mm("
for op in nms conv2d mm; do
    check "list shows $op with its schema" grep -qE "^$op\(.*\) -> " "$T/out"
    check "list shows the source of $op" grep -qF "$OPS/$op.c" "$T/out"
done
check "list shows the cpu kernels" grep -qE '^ +cpu(/[a-z0-9]+)? +/' "$T/out"
check "list shows the nms schema" \
    grep -qF "nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor" "$T/out"

# --ops-path alone (no environment)
run env -u OPJIT_OPS_PATH "$CLI" list --ops-path "$OPS"
expect "list --ops-path" 0 "mm("
run env -u OPJIT_OPS_PATH "$CLI" --ops-path "$OPS" list
expect "--ops-path before list" 0 "nms("
run env -u OPJIT_OPS_PATH "$CLI" list --ops-path "$T/no-such-dir"
expect "list --ops-path missing dir" 1 "" "$T/no-such-dir"

# --- load ----------------------------------------------------------------------

CACHE2=$T/cache-load
run "$CLI" --cache "$CACHE2" load "$OPS/mm.c"
expect "load mm.c" 0 "mm("
check "load shows the timings" grep -qE 'key [0-9.]+ ms, compile [0-9.]+ ms, load [0-9.]+ ms, total [0-9.]+ ms' "$T/out"
check "first load is a miss" grep -qF "cache miss" "$T/out"
check "--cache DIR is used" test -n "$(ls -A "$CACHE2" 2>/dev/null)"
run "$CLI" --cache "$CACHE2" load "$OPS/mm.c"
expect "load mm.c again" 0 "cache hit"
run "$CLI" load "$OPS/mm.c" "$T/nope.c" "$OPS/nms.c"
expect "load with a missing file" 1 "nms(" "$T/nope.c"

# --- call mm -------------------------------------------------------------------

npy_f32 "$T/a.npy" "(2, 2)" 1 2 3 4
npy_f32 "$T/b.npy" "(2, 2)" 5 6 7 8
run "$CLI" call mm self=@"$T/a.npy" mat2=@"$T/b.npy"
expect "call mm prints" 0 "output 0: shape (2, 2), dtype float32"
check "call mm values" grep -qF "[[19. 22.]" "$T/out"
check "call mm values (row 2)" grep -qF " [43. 50.]]" "$T/out"

run "$CLI" call mm self=@"$T/a.npy" mat2=@"$T/b.npy" --out "$T/c.npy"
expect "call mm --out" 0 "$T/c.npy"
check "call mm --out data" test "$(npy_data_hex "$T/c.npy")" = "$(hex_f32 19 22 43 50)"
check "call mm --out header" grep -qaF "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }" "$T/c.npy"
if [[ $HAVE_NUMPY == 1 ]]; then
    check "numpy reads the output" /usr/bin/python3 -c "
import numpy as np, sys
c = np.load(sys.argv[1])
assert c.dtype == np.float32 and c.shape == (2, 2), (c.dtype, c.shape)
assert (c == np.array([[19, 22], [43, 50]], np.float32)).all(), c" "$T/c.npy"
    # numpy-written inputs, with a shape the printf files do not cover
    /usr/bin/python3 -c "
import numpy as np, sys
np.save(sys.argv[1], np.arange(6, dtype=np.float32).reshape(2, 3))
np.save(sys.argv[2], np.arange(12, dtype=np.float32).reshape(3, 4) / 4)" "$T/np_a.npy" "$T/np_b.npy"
    run "$CLI" call mm self=@"$T/np_a.npy" mat2=@"$T/np_b.npy" --out "$T/np_c.npy"
    expect "call mm on numpy files" 0
    check "numpy agrees" /usr/bin/python3 -c "
import numpy as np, sys
a, b, c = (np.load(p) for p in sys.argv[1:])
assert c.shape == (2, 4) and np.allclose(a @ b, c), c" "$T/np_a.npy" "$T/np_b.npy" "$T/np_c.npy"
fi

# a mm by a path instead of a name
run "$CLI" call "$OPS/mm.c" self=@"$T/a.npy" mat2=@"$T/b.npy"
expect "call mm by path" 0 "[[19. 22.]"

# --- call: errors ----------------------------------------------------------------

run "$CLI" call nosuchop x=1
expect "unknown op" 1 "" "nosuchop"
run "$CLI" call mm self=@"$T/a.npy" mat2=@"$T/b.npy" bogus=1
expect "unknown argument" 1 "" "has no argument 'bogus'"
check "unknown argument: the schema is shown" grep -qF "mm(" "$T/err"
run "$CLI" call mm self=@"$T/a.npy"
expect "missing argument" 1 "" "missing required argument 'mat2'"
run "$CLI" call mm self=@"$T/a.npy" mat2=3
expect "number for a tensor" 1 "" "argument 'mat2' is a Tensor"
run "$CLI" call mm self=@"$T/a.npy" self=@"$T/a.npy" mat2=@"$T/b.npy"
expect "argument given twice" 1 "" "'self' is given twice"
run "$CLI" call mm self=@"$T/a.npy" mat2=@"$T/missing.npy"
expect "missing npy" 1 "" "missing.npy: cannot open"
printf 'this is not numpy' >"$T/bad.npy"
run "$CLI" call mm self=@"$T/a.npy" mat2=@"$T/bad.npy"
expect "malformed npy" 1 "" "bad.npy: not a .npy file"
head -c 100 "$T/a.npy" >"$T/trunc.npy"
run "$CLI" call mm self=@"$T/a.npy" mat2=@"$T/trunc.npy"
expect "truncated npy" 1 "" "truncated"
npy "$T/be.npy" '>f4' "(2, 2)" "$(le 16 0)"
run "$CLI" call mm self=@"$T/a.npy" mat2=@"$T/be.npy"
expect "big-endian npy" 1 "" "big-endian"
# --device cuda: tests/test_cli_cuda.sh
run "$CLI" call mm self=@"$T/a.npy" mat2=@"$T/b.npy" --out "$T/o1.npy" --out "$T/o2.npy"
expect "too many --out" 1 "" "--out files"
run "$CLI" call mm self=@"$T/a.npy" mat2=@"$T/b.npy" --out "$T/no-dir/o.npy"
expect "--out to a missing directory" 1 "" "cannot create"
npy_f32 "$T/v3.npy" "(3,)" 1 2 3
run "$CLI" call mm self=@"$T/a.npy" mat2=@"$T/v3.npy"
expect "shape mismatch reaches the runtime's check" 1 "" "mm"

# --- call nms: float argument, int64 output ---------------------------------------

# boxes 0 and 1 overlap (IoU 0.81), box 2 is apart; scores 9, 8, 7
npy_f32 "$T/boxes.npy" "(3, 4)" 0 0 10 10 1 1 10 10 20 20 30 30
npy_f32 "$T/scores.npy" "(3,)" 9 8 7
run "$CLI" call nms boxes=@"$T/boxes.npy" scores=@"$T/scores.npy" iou_threshold=0.5
expect "call nms" 0 "dtype int64"
check "nms keeps boxes 0 and 2" grep -qxF "[0 2]" "$T/out"
run "$CLI" call nms boxes=@"$T/boxes.npy" scores=@"$T/scores.npy" iou_threshold=1
expect "float argument given as an integer" 0 "[0 1 2]"
run "$CLI" call nms boxes=@"$T/boxes.npy" scores=@"$T/scores.npy" iou_threshold=half
expect "bad float" 1 "" "argument 'iou_threshold' is a float: 'half' is not a number"
run "$CLI" call nms boxes=@"$T/boxes.npy" scores=@"$T/scores.npy" iou_threshold=true
expect "bool for a float" 1 "" "iou_threshold"
run "$CLI" call nms boxes=@"$T/boxes.npy" scores=@"$T/scores.npy" iou_threshold=none
expect "none for a required float" 1 "" "argument 'iou_threshold' (float) is required"
run "$CLI" call nms boxes=@"$T/boxes.npy" scores=@"$T/scores.npy" iou_threshold=0.5 --out "$T/keep.npy"
expect "nms --out" 0
check "nms --out is int64" grep -qaF "'descr': '<i8'" "$T/keep.npy"
check "nms --out data" test "$(npy_data_hex "$T/keep.npy")" = "$(printf "$(le 8 0)$(le 8 2)" | od -An -v -tx1 | tr -d ' \n')"

# --- call conv2d: int[2] arguments, optional tensor ----------------------------------

# input 1x1x4x4 of 1..16, weight 1x1x2x2 of ones
npy_f32 "$T/x.npy" "(1, 1, 4, 4)" 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16
npy_f32 "$T/w.npy" "(1, 1, 2, 2)" 1 1 1 1
CONV_SCHEMA=$(grep -E '^conv2d\(' <("$CLI" list) || true)
if [[ "$CONV_SCHEMA" == *"int[2] stride"* ]]; then
    run "$CLI" call conv2d input=@"$T/x.npy" weight=@"$T/w.npy" stride=2
    expect "conv2d stride=2" 0 "output 0: shape (1, 1, 2, 2), dtype float32"
    check "conv2d stride=2 values" grep -qF "[[[[14. 22.]" "$T/out"
    run "$CLI" call conv2d input=@"$T/x.npy" weight=@"$T/w.npy" stride=2,2
    expect "conv2d stride=2,2" 0 "[[[[14. 22.]"
    run "$CLI" call conv2d input=@"$T/x.npy" weight=@"$T/w.npy" stride=1,2
    expect "conv2d stride=1,2" 0 "shape (1, 1, 3, 2)"
    run "$CLI" call conv2d input=@"$T/x.npy" weight=@"$T/w.npy" stride=1,2,3
    expect "conv2d three strides" 1 "" "argument 'stride' is an int[2]: it takes 2 integers"
    run "$CLI" call conv2d input=@"$T/x.npy" weight=@"$T/w.npy" stride=0.5
    expect "conv2d float stride" 1 "" "argument 'stride'"
    if [[ "$CONV_SCHEMA" == *"Tensor? bias"* ]]; then
        run "$CLI" call conv2d input=@"$T/x.npy" weight=@"$T/w.npy" bias=none
        expect "conv2d bias=none" 0 "[[[[14. 18. 22.]"
        npy_f32 "$T/bias.npy" "(1,)" 100
        run "$CLI" call conv2d input=@"$T/x.npy" weight=@"$T/w.npy" bias=@"$T/bias.npy"
        expect "conv2d with a bias" 0 "[[[[114. 118. 122.]"
    else
        fail "conv2d has no 'Tensor? bias' argument: $CONV_SCHEMA"
    fi
else
    fail "conv2d has no 'int[2] stride' argument: $CONV_SCHEMA"
fi
# a str argument: conv2d.padding's padding="valid" | "same"
run "$CLI" call conv2d.padding input=@"$T/x.npy" weight=@"$T/w.npy" padding=same
expect "conv2d.padding padding=same" 0 "shape (1, 1, 4, 4)"
check "conv2d.padding same values" grep -qF "[[[[14. 18. 22. 12.]" "$T/out"
run "$CLI" call conv2d.padding input=@"$T/x.npy" weight=@"$T/w.npy"
expect "conv2d.padding default valid" 0 "shape (1, 1, 3, 3)"
run "$CLI" call conv2d.padding input=@"$T/x.npy" weight=@"$T/w.npy" padding=full
expect "conv2d.padding padding=full" 1 "" "Invalid padding string: 'full'"

# --- the op author's flow: a new source, called without rebuilding ------------------

mkdir -p "$T/myops"
write_add() { # write_add N: an add1 op adding N
    cat >"$T/myops/add1.c" <<EOF
#include <opjit_op.h>

static int add1_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    DLTensor *y = opjit_output(ctx, 0, x->dtype, x->ndim, x->shape);
    if (!y)
        return -1;
    const float *src = (const float *)opjit_data(x);
    float *dst = (float *)opjit_data(y);
    int64_t n = opjit_numel(x);
    for (int64_t i = 0; i < n; i++)
        dst[i] = src[i] + $1.0f;
    return 0;
}

OPJIT_MODULE(add1, m)
{
    opjit_def(m, "add1(Tensor x) -> Tensor", OPJIT_CPU, add1_cpu, "x + $1");
    opjit_require(m, "x", "float32 contiguous");
}
EOF
}
write_add 1
npy_f32 "$T/v.npy" "(4,)" 1 2 3 -4
run "$CLI" call add1 x=@"$T/v.npy" --ops-path "$T/myops"
expect "new op via --ops-path" 0 "output 0: shape (4,), dtype float32"
check "new op result" grep -qxF "[ 2.  3.  4. -3.]" "$T/out"
run env OPJIT_OPS_PATH="$T/myops:$OPS" "$CLI" call add1 x=@"$T/v.npy"
expect "new op via OPJIT_OPS_PATH" 0 "[ 2.  3.  4. -3.]"
run "$CLI" call "$T/myops/add1.c" x=@"$T/v.npy" --out "$T/v1.npy"
expect "new op by path" 0
check "new op by path: --out data" test "$(npy_data_hex "$T/v1.npy")" = "$(hex_f32 2 3 4 -3)"
run "$CLI" list --ops-path "$T/myops"
expect "list shows the new op" 0 "add1(Tensor x) -> Tensor"
check "list shows the new op's doc" grep -qE "cpu(/[a-z0-9]+)? +$T/myops/add1.c +x \\+ 1" "$T/out"
check "list still shows the shipped ops" grep -qE '^mm\(' "$T/out"
run "$CLI" load "$T/myops/add1.c"
expect "load the new op" 0 "add1(Tensor x) -> Tensor"
# edit it: the next call sees the change
write_add 2
run "$CLI" call add1 x=@"$T/v.npy" --ops-path "$T/myops"
expect "edited op" 0 "[ 3.  4.  5. -2.]"
# the op's own checks
npy_i64 "$T/ints.npy" "(2,)" 1 2
run "$CLI" call add1 x=@"$T/ints.npy" --ops-path "$T/myops"
expect "wrong dtype for the new op" 1 "" "x"
# no output at all: 0-d and empty tensors go through
npy_f32 "$T/scalar.npy" "()" 41
run "$CLI" call add1 x=@"$T/scalar.npy" --ops-path "$T/myops"
expect "0-d tensor" 0 "shape (), dtype float32"
check "0-d value" grep -qxF "43." "$T/out"
npy_f32 "$T/empty.npy" "(0, 3)"
run "$CLI" call add1 x=@"$T/empty.npy" --ops-path "$T/myops"
expect "empty tensor" 0 "shape (0, 3), dtype float32"
check "empty value" grep -qxF "[]" "$T/out"
# big outputs are not printed
big=""
for ((i = 0; i < 1001; i++)); do big+='\x00\x00\x00\x00'; done
npy "$T/big.npy" '<f4' "(1001,)" "$big"
run "$CLI" call add1 x=@"$T/big.npy" --ops-path "$T/myops"
expect "big output" 0 "shape (1001,)" 
check "big output: hint to use --out" grep -qF -- "--out" "$T/out"

# a source that does not compile: reported, the others still listed
mkdir -p "$T/badops"
printf '#include <opjit_op.h>\nint broken( { return 0; }\n' >"$T/badops/broken.c"
run "$CLI" list --ops-path "$T/badops"
expect "list with a broken source" 1 "mm(" "broken"
check "the compile error has a line number" grep -qE 'broken\.c:2' "$T/err"
run "$CLI" call broken --ops-path "$T/badops"
expect "call a broken source" 1 "" "broken.c:2"

# -v logs through the callback
run "$CLI" -v --cache "$T/cache-verbose" call add1 x=@"$T/v.npy" --ops-path "$T/myops"
expect "-v" 0 "output 0"
check "-v logs" grep -qE '^opjit: (error|warning|info|debug): ' "$T/err"

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
