#!/usr/bin/env bash
# tests/test_torch_compare.sh - the shipped CPU ops (nms, conv2d, mm), run
# through the opjit CLI, against torchvision.ops.nms, F.conv2d and torch.mm
# (tests/compare_torch.py). Twice: on the libtcc code, then on the
# optimizing tier's code (gcc -O2) when a C compiler is there.
# Skips (exit 77) where /usr/bin/python3 cannot import torch and torchvision.
set -u

here=$(cd "$(dirname "$0")" && pwd)
py=${OPJIT_PYTHON:-/usr/bin/python3}
cli=${OPJIT_CLI:?OPJIT_CLI must name the opjit command}
tmp=${OPJIT_TEST_TMP:-$(mktemp -d)}

if ! [ -x "$py" ] || ! "$py" -c 'import numpy, torch, torchvision' >/dev/null 2>&1; then
    echo "SKIP: $py cannot import numpy, torch and torchvision"
    exit 77
fi

rm -rf "$tmp"
mkdir -p "$tmp/tcc" "$tmp/opt"
export OPJIT_OPS_PATH=${OPJIT_OPS_PATH:-$here/../ops-src}
export OPJIT_CACHE_DIR=${OPJIT_CACHE_DIR:-$tmp/cache}

status=0
# The libtcc code: tiering off and a fresh cache of its own (a cache that
# already holds optimized code would serve that).
OPJIT_TIERING=0 OPJIT_CACHE_DIR="$tmp/cache-tcc" \
    "$py" "$here/compare_torch.py" --cli "$cli" --tmp "$tmp/tcc" --label tcc || status=1

# The optimized code: build it into the cache, then run with tiering on so
# every call loads it.
cc=${OPJIT_CC:-cc}
if command -v "$cc" >/dev/null 2>&1; then
    if OPJIT_TIERING=1 "$cli" warm --opt nms conv2d mm >"$tmp/warm.log" 2>&1; then
        OPJIT_TIERING=1 "$py" "$here/compare_torch.py" --cli "$cli" --tmp "$tmp/opt" --label opt --quick || status=1
    else
        echo "FAIL: opjit warm --opt nms conv2d mm"
        cat "$tmp/warm.log"
        status=1
    fi
else
    echo "note: no C compiler ($cc): the optimizing tier is not compared"
fi
exit $status
