#!/usr/bin/env bash
# tests/test_cli_cuda.sh - `opjit call --device cuda`: the tensors go to GPU 0
# and the outputs come back, giving what the CPU gives; without a driver or a
# device the call fails (exit 1) saying which is missing.
#
# The GPU is tests/fake_libcuda.c, a stand-in driver built here with
# $OPJIT_CC and handed over through OPJIT_CUDA_DRIVER (its "kernels" are
# serial C emulations of the shipped .cu kernels; see tests/test_cuda.c).
# Those checks need NVRTC to compile the .cu ops, and are skipped without it.
#
# Env (set by ctest): OPJIT_CLI, OPJIT_OPS_PATH, OPJIT_TEST_TMP,
# OPJIT_CACHE_DIR, OPJIT_CC, OPJIT_SOURCE_DIR.
set -euo pipefail

. "$(dirname "$0")/cli_lib.sh"
need_cli
fresh_tmp
OPS=${OPJIT_OPS_PATH:?OPJIT_OPS_PATH must name ops-src}
SRC=${OPJIT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
export OPJIT_CACHE_DIR=${OPJIT_CACHE_DIR:-$T/cache}
unset OPJIT_CUDA_DRIVER FAKE_CUDA_DEVICES FAKE_CUDA_CC OPJIT_CUDA_ARCHS

npy_f32 "$T/a.npy" "(2, 2)" 1 2 3 4
npy_f32 "$T/b.npy" "(2, 2)" 5 6 7 8
npy_f32 "$T/e.npy" "(0, 2)"
# boxes 0 and 1 overlap (IoU 0.81), box 2 is apart; scores 9, 8, 7
npy_f32 "$T/boxes.npy" "(3, 4)" 0 0 10 10 1 1 10 10 20 20 30 30
npy_f32 "$T/scores.npy" "(3,)" 9 8 7
MM=(mm self=@"$T/a.npy" mat2=@"$T/b.npy")

# --- no driver ---------------------------------------------------------------------

# A driver library that is not there: exit 1, naming it, nothing written.
NODRV=$T/no-such-dir/libcuda.so.1
run env OPJIT_CUDA_DRIVER="$NODRV" "$CLI" call "${MM[@]}" --device cuda --out "$T/nodrv.npy"
expect "no driver library" 1 "" "no $NODRV: "
check "no driver: the reason" grep -qF "the NVIDIA driver is not installed" "$T/err"
check "no driver: the argument is named" grep -qF "argument 'self'" "$T/err"
check "no driver: nothing on stdout" test ! -s "$T/out"
check "no driver: no output file" test ! -e "$T/nodrv.npy"

# This machine's own driver: where there is none, the same message the
# library gives for libcuda.so.1.
run "$CLI" call "${MM[@]}" --device cuda
if [[ $rc == 0 ]]; then
    echo "note: a CUDA driver and device are here; the no-driver check is skipped" >&2
    expect "--device cuda on this machine's GPU" 0 "[[19. 22.]"
elif grep -qF "no libcuda.so.1" "$T/err"; then
    expect "no libcuda.so.1" 1 "" "no libcuda.so.1: "
    check "no libcuda.so.1: one line" test "$(wc -l <"$T/err")" = 1
else
    expect "a driver without a device" 1 "" "no CUDA device"
fi

# --- the fake driver ----------------------------------------------------------------

FAKE=$T/libfakecuda.so
if [[ -z "${OPJIT_CC:-}" ]]; then
    echo "note: no OPJIT_CC: the fake-driver checks are skipped" >&2
elif ! "$OPJIT_CC" -shared -fPIC -O1 -o "$FAKE" "$SRC/tests/fake_libcuda.c"; then
    fail "cannot build the fake driver with $OPJIT_CC"
else
    export OPJIT_CUDA_DRIVER=$FAKE
    run "$CLI" load "$OPS/mm.cu"
    if [[ $rc != 0 ]] && grep -qF "NVRTC" "$T/err"; then
        echo "note: no NVRTC here: the fake-driver checks are skipped" >&2
        unset OPJIT_CUDA_DRIVER
    else
        expect "load mm.cu with the fake driver" 0 "mm("
    fi
fi

if [[ "${OPJIT_CUDA_DRIVER:-}" == "$FAKE" ]]; then
    # The CPU's answers, for comparison.
    env -u OPJIT_CUDA_DRIVER "$CLI" call "${MM[@]}" >"$T/cpu.txt"
    env -u OPJIT_CUDA_DRIVER "$CLI" call "${MM[@]}" --out "$T/cpu.npy" >/dev/null

    run "$CLI" call "${MM[@]}" --device cuda
    expect "mm --device cuda" 0 "output 0: shape (2, 2), dtype float32"
    check "mm --device cuda prints the CPU result" cmp -s "$T/out" "$T/cpu.txt"
    check "mm --device cuda values" grep -qF " [43. 50.]]" "$T/out"

    run "$CLI" call "${MM[@]}" --device cuda --out "$T/cuda.npy"
    expect "mm --device cuda --out" 0 "$T/cuda.npy"
    check "mm --device cuda --out: the CPU's file, byte for byte" cmp -s "$T/cuda.npy" "$T/cpu.npy"

    # Only the .cu loaded: the CUDA kernel is what ran.
    run "$CLI" call "$OPS/mm.cu" self=@"$T/a.npy" mat2=@"$T/b.npy" --device cuda
    expect "mm.cu alone --device cuda" 0 "[[19. 22.]"
    run "$CLI" call "$OPS/mm.cu" self=@"$T/a.npy" mat2=@"$T/b.npy"
    expect "mm.cu alone on the cpu" 1 "" "has no CPU kernel"
    # ... and a CPU-only op has nothing to run there.
    run "$CLI" call "$OPS/mm.c" self=@"$T/a.npy" mat2=@"$T/b.npy" --device cuda
    expect "mm.c alone --device cuda" 1 "" "has no CUDA kernel"

    # An empty operand: an empty result.
    run "$CLI" call mm self=@"$T/e.npy" mat2=@"$T/b.npy" --device cuda
    expect "empty mm --device cuda" 0 "output 0: shape (0, 2), dtype float32"
    check "empty mm --device cuda value" grep -qxF "[]" "$T/out"

    # A float argument and an int64 output.
    run "$CLI" call nms boxes=@"$T/boxes.npy" scores=@"$T/scores.npy" iou_threshold=0.5 --device cuda
    expect "nms --device cuda" 0 "dtype int64"
    check "nms --device cuda keeps boxes 0 and 2" grep -qxF "[0 2]" "$T/out"

    # A driver without devices.
    run env FAKE_CUDA_DEVICES=0 "$CLI" call "${MM[@]}" --device cuda
    expect "no CUDA device" 1 "" "no CUDA device"
    check "no CUDA device: nothing on stdout" test ! -s "$T/out"
fi

# Half precision in device code: CUDA's cuda_fp16.h and cuda_bf16.h, found
# like the other toolkit headers, their sizes in the key (cache why).
if "$CLI" warm --ops-path "$OPS" --arch sm_90 mm >/dev/null 2>&1; then
    cat >"$T/h16.cu" <<'EOF'
#ifdef __CUDACC_RTC__
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void twice(int n, const __half *x, __half *y, const __nv_bfloat16 *bx,
                                 __nv_bfloat16 *by)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = __hadd(x[i], x[i]);
        by[i] = __float2bfloat16(2.0f * __bfloat162float(bx[i]));
    }
}
#else
#include <opjit_op.h>
static int k(opjit_ctx *ctx, opjit_args *a) { (void)ctx; (void)a; return 0; }
OPJIT_MODULE(h16, m) { opjit_def(m, "h16(Tensor x) -> Tensor", OPJIT_CUDA, k, ""); }
#endif
EOF
    run "$CLI" warm --arch sm_90 "$T/h16.cu"
    expect "device code with cuda_fp16.h and cuda_bf16.h compiles" 0 "1 compiled"
    run "$CLI" cache why --arch sm_90 "$T/h16.cu"
    expect "  its key holds the half-precision headers" 0 "cuda_fp16.h:"
    check "  and cuda_bf16.h" grep -q "cuda_bf16.h:" "$T/out"
fi

# Warming without NVRTC: .cu sources are skipped, unless device code is
# asked for with --arch, which makes them failures.
run env OPJIT_NVRTC_LIBRARY=/nonexistent/libnvrtc.so OPJIT_CUDA_ARCHS= \
    OPJIT_CACHE_DIR="$T/warm-cache" "$CLI" warm --ops-path "$OPS" mm
expect "warm without NVRTC skips mm.cu" 0 "skipped  "
check "... and compiles mm.c" grep -q "compiled .*mm.c" "$T/out"
run env OPJIT_NVRTC_LIBRARY=/nonexistent/libnvrtc.so OPJIT_CUDA_ARCHS= \
    OPJIT_CACHE_DIR="$T/warm-cache" "$CLI" warm --ops-path "$OPS" --arch sm_90 mm
expect "warm --arch without NVRTC fails" 1 "1 failed" "no NVRTC"

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
