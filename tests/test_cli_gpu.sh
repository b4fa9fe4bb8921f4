#!/usr/bin/env bash
# tests/test_cli_gpu.sh - end to end on a real GPU: `opjit call --device cuda`
# through the real driver gives the CPU's answers, byte for byte, for nms,
# mm and conv2d; a cache warmed for this GPU (cubin and PTX) serves an
# offline process. Skips (77) where there is no usable GPU.
#
# Env (set by ctest): OPJIT_CLI, OPJIT_OPS_PATH, OPJIT_TEST_TMP, OPJIT_CACHE_DIR.
set -euo pipefail

. "$(dirname "$0")/cli_lib.sh"
need_cli
fresh_tmp
OPS=${OPJIT_OPS_PATH:?OPJIT_OPS_PATH must name ops-src}
export OPJIT_CACHE_DIR=${OPJIT_CACHE_DIR:-$T/cache}
unset OPJIT_CUDA_DRIVER OPJIT_CUDA_ARCHS

npy_f32 "$T/a.npy" "(2, 3)" 1 2 3 4 5 6
npy_f32 "$T/b.npy" "(3, 2)" 7 8 9 10 11 12
run "$CLI" call mm self=@"$T/a.npy" mat2=@"$T/b.npy" --device cuda
if [[ $rc != 0 ]]; then
    echo "skipped: no usable GPU here ($(head -c 300 "$T/err"))"
    exit 77
fi
expect "mm --device cuda on the real driver" 0 "[[ 58.  64.]"

# Random integer boxes (exact in float32): 400 of them, clustered so that
# many overlap.
awk 'BEGIN { srand(7); for (i = 0; i < 400; i++) { x = int(rand() * 200); y = int(rand() * 200);
     printf "%d %d %d %d\n", x, y, x + 5 + int(rand() * 40), y + 5 + int(rand() * 40) } }' >"$T/b.txt"
awk 'BEGIN { srand(11); for (i = 0; i < 400; i++) printf "%d\n", int(rand() * 1000) }' >"$T/s.txt"
# shellcheck disable=SC2046
npy_f32 "$T/boxes.npy" "(400, 4)" $(cat "$T/b.txt")
# shellcheck disable=SC2046
npy_f32 "$T/scores.npy" "(400,)" $(cat "$T/s.txt")
NMS=(nms boxes=@"$T/boxes.npy" scores=@"$T/scores.npy" iou_threshold=0.4)

run "$CLI" call "${NMS[@]}" --out "$T/nms-cpu.npy"
expect "nms on the CPU" 0
run "$CLI" call "${NMS[@]}" --device cuda --out "$T/nms-gpu.npy"
expect "nms on the GPU" 0
check "nms: the GPU keeps exactly the CPU's boxes" cmp -s "$T/nms-cpu.npy" "$T/nms-gpu.npy"
check "nms: some boxes were suppressed" test "$(stat -c %s "$T/nms-cpu.npy")" -lt $((128 + 400 * 8))

# conv2d with small integers: every product and sum is exact in float32.
awk 'BEGIN { srand(3); for (i = 0; i < 2 * 3 * 9 * 9; i++) printf "%d ", int(rand() * 5) - 2 }' >"$T/x.txt"
awk 'BEGIN { srand(5); for (i = 0; i < 4 * 3 * 3 * 3; i++) printf "%d ", int(rand() * 5) - 2 }' >"$T/w.txt"
# shellcheck disable=SC2046
npy_f32 "$T/x.npy" "(2, 3, 9, 9)" $(cat "$T/x.txt")
# shellcheck disable=SC2046
npy_f32 "$T/w.npy" "(4, 3, 3, 3)" $(cat "$T/w.txt")
npy_f32 "$T/bias.npy" "(4,)" 1 -2 3 0
CONV=(conv2d input=@"$T/x.npy" weight=@"$T/w.npy" bias=@"$T/bias.npy" stride=2,1 padding=1,2)
run "$CLI" call "${CONV[@]}" --out "$T/conv-cpu.npy"
expect "conv2d on the CPU" 0
run "$CLI" call "${CONV[@]}" --device cuda --out "$T/conv-gpu.npy"
expect "conv2d on the GPU" 0
check "conv2d: the GPU's output is the CPU's, byte for byte" cmp -s "$T/conv-cpu.npy" "$T/conv-gpu.npy"

# Warm a separate cache for this GPU's cubin and a PTX, then call offline
# from it as a read-only layer: no compiler runs, the GPU code is there.
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
if [[ -n "$cc" ]]; then
    run env OPJIT_CACHE_DIR="$T/warm" "$CLI" warm --arch "sm_$cc,compute_$cc" nms mm
    expect "warm --arch sm_$cc,compute_$cc" 0
    check "warm: a cubin for this GPU" test -n "$(find "$T/warm" -name "sm_$cc.cubin")"
    check "warm: a PTX for this GPU" test -n "$(find "$T/warm" -name "compute_$cc.ptx")"
    run env OPJIT_CACHE_DIR="$T/empty" OPJIT_CACHE_READONLY="$T/warm" OPJIT_OFFLINE=1 \
        OPJIT_CUDA_ARCHS="sm_$cc" "$CLI" call "${NMS[@]}" --device cuda --out "$T/nms-off.npy"
    expect "offline nms from the warmed layer" 0
    check "offline nms: the CPU's boxes" cmp -s "$T/nms-cpu.npy" "$T/nms-off.npy"
    run env OPJIT_CACHE_DIR="$T/empty2" OPJIT_CACHE_READONLY="$T/warm" OPJIT_OFFLINE=1 \
        OPJIT_CUDA_ARCHS="compute_$cc" "$CLI" call "${NMS[@]}" --device cuda --out "$T/nms-ptx.npy"
    expect "offline nms from the warmed PTX" 0
    check "offline nms from PTX: the CPU's boxes" cmp -s "$T/nms-cpu.npy" "$T/nms-ptx.npy"
else
    echo "note: nvidia-smi gave no compute capability; the warm checks are skipped" >&2
fi

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
