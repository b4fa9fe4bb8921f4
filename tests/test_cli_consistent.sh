#!/usr/bin/env bash
# tests/test_cli_consistent.sh - the commands of `opjit` agree with each
# other (issue 24, item 5, and the rest of item 4): load takes an op name
# as call does; --json on every command that prints data, each document
# parsed; cache ls shows artifacts (index entries with --all) in aligned
# columns and prints nothing before failing; warm --opt says what it built;
# a load that waited for another process's compile says so; watch reports
# a compile error once, under one spelling of its path; --arch is named in
# its own error; NVRTC's diagnostics name the file once; --device cuda on
# a CPU-only op says the op has no CUDA kernel; CUDA sources skipped on a
# machine without a GPU are mentioned once, and only at -v.
#
# Env (set by ctest): OPJIT_CLI, OPJIT_OPS_PATH, OPJIT_TEST_TMP, OPJIT_CC.
set -euo pipefail

. "$(dirname "$0")/cli_lib.sh"
need_cli
fresh_tmp
SHIPPED=${OPJIT_OPS_PATH:?OPJIT_OPS_PATH must name ops-src}
unset OPJIT_TIERING OPJIT_OFFLINE OPJIT_CACHE_READONLY OPJIT_CACHE_MAX_SIZE \
    OPJIT_REMOTE_CACHE OPJIT_CUDA_ARCHS
export OPJIT_CACHE_DIR="$T/cache"
OPS=$T/ops
export OPJIT_OPS_PATH=$OPS
mkdir -p "$OPS"

cat >"$OPS/add1.c" <<'EOF'
#include <opjit_op.h>

static int add1_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    DLTensor *y = opjit_output(ctx, 0, x->dtype, x->ndim, x->shape);
    if (!y)
        return -1;
    const float *src = (const float *)opjit_data(x);
    float *dst = (float *)opjit_data(y);
    for (int64_t i = 0; i < opjit_numel(x); i++)
        dst[i] = src[i] + 1.0f;
    return 0;
}

OPJIT_MODULE(add1, m)
{
    opjit_def(m, "add1(Tensor x) -> Tensor", OPJIT_CPU, add1_cpu, "x + 1");
    opjit_require(m, "x", "float32 contiguous");
}
EOF
# A module whose ops are not named after its file.
cat >"$OPS/pair.c" <<'EOF'
#include <opjit_op.h>
static int k(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }
OPJIT_MODULE(pair, m)
{
    opjit_def(m, "pair_first() -> Tensor", OPJIT_CPU, k, "");
    opjit_def(m, "pair_second() -> Tensor", OPJIT_CPU, k, "");
}
EOF
npy_f32 "$T/v.npy" "(4,)" 1 2 3 -4

# json_check WHAT FILE PYTHON-EXPR: FILE parses as JSON (python3's parser)
# and EXPR, with the document as d, is true.
json_check() {
    local what=$1 file=$2 expr=$3
    if python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if eval(sys.argv[2]) else 1)' "$file" "$expr" 2>"$T/json.err"; then
        pass
    else
        fail "$what: not JSON, or not $expr"
        sed 's/^/    /' "$file" "$T/json.err" >&2 || true
    fi
}

# --- load NAME, as call takes it ---------------------------------------------
run "$CLI" load add1
expect "load takes an op name" 0 "add1(Tensor x) -> Tensor  [cpu]"
check "  and loads its source" grep -qF "$OPS/add1.c: " "$T/out"
run "$CLI" load pair_second
expect "load takes the name of an op its module registers" 0 "pair_second() -> Tensor"
check "  naming the module's source" grep -qF "$OPS/pair.c: loaded (the module of op pair_second)" "$T/out"
run "$CLI" load no_such_op
expect "load of a name with no source" 1 "" "no source for op 'no_such_op'"
run "$CLI" load "$OPS/add1.c" add1
expect "load mixes files and names" 0 "add1(Tensor x)"

# --- --json on every command that prints data --------------------------------
run "$CLI" list --json
expect "list --json" 0
json_check "list --json" "$T/out" \
    'any(r["op"] == "pair_second" and r["device"] == "cpu" and r["source"].endswith("/pair.c") for r in d)'
# Names from disk stay JSON: a directory whose name is not UTF-8 and holds
# an escape byte.
odd=$T/$'od\xff\x1bd'
mkdir -p "$odd"
cp "$OPS/add1.c" "$odd/"
run "$CLI" list --json --ops-path "$odd"
expect "list --json of an odd directory name" 0
json_check "  stays JSON" "$T/out" \
    'any(r["source"].endswith("od\ufffd\u001bd/add1.c") for r in d)'
run "$CLI" load --json add1 no_such_op
expect "load --json with a failure" 1 "" "no_such_op"
json_check "load --json" "$T/out" \
    'd[0]["loaded"] and d[0]["ops"][0]["op"] == "add1" and d[0]["ops"][0]["devices"] == ["cpu"] and d[0]["wait_ms"] == 0 and not d[1]["loaded"] and "no_such_op" in d[1]["error"]'
run "$CLI" call --json add1 x=@"$T/v.npy"
expect "call --json" 0
json_check "call --json" "$T/out" \
    'd["op"] == "add1" and d["outputs"][0]["values"] == [2.0, 3.0, 4.0, -3.0] and d["outputs"][0]["shape"] == [4] and d["outputs"][0]["file"] is None'
run "$CLI" call --json add1 x=@"$T/v.npy" --out "$T/o.npy"
expect "call --json --out" 0
json_check "call --json --out" "$T/out" \
    'd["outputs"][0]["values"] is None and d["outputs"][0]["file"].endswith("o.npy")'
run "$CLI" warm --json add1 no_such_op
expect "warm --json with a name without a source" 1
json_check "warm --json" "$T/out" \
    'd["hits"] == 1 and d["nosource"] == 1 and not d["ok"] and {r["result"] for r in d["results"]} == {"hit", "nosource"}'
check "  no progress text on stdout" test "$(head -c1 "$T/out")" = "{"
run "$CLI" cache why --json add1
expect "cache why --json" 0
json_check "cache why --json" "$T/out" \
    'any(r["compiler"] == "tcc" and r["cached"] and any(l.startswith("source add1.c ") for l in r["inputs"]) for r in d)'
for verb in ls info verify; do
    run "$CLI" cache $verb --json
    expect "cache $verb --json" 0
    json_check "cache $verb --json" "$T/out" 'd is not None'
done

# --- cache ls: artifacts, aligned; index entries with --all ------------------
run "$CLI" cache ls
expect "cache ls" 0 "add1.c" "index entries not shown (--all shows them)"
check "  no index rows by default" test "$(awk 'NR > 1 && $5 ~ /index$/' "$T/out" | wc -l)" = 0
run "$CLI" cache ls --all
expect "cache ls --all" 0 "index"
check "  shows the index rows" test "$(awk 'NR > 1 && $5 ~ /index$/' "$T/out" | wc -l)" -gt 0
# Every column starts where its header does.
check "  columns aligned under their headers" python3 - "$T/out" <<'EOF'
import sys
lines = open(sys.argv[1]).read().splitlines()
head = lines[0]
starts = [head.index(h) for h in ("OP", "SOURCE", "TARGET", "TIER", "LAST USE", "LAYER")]
ends = [head.index("SIZE") + 4]
for line in lines[1:]:
    for s in starts:
        assert line[s - 2:s] == "  " and line[s] != " ", (line, s)
    for e in ends:
        assert line[e - 1] == "B" and line[e:e + 2] == "  ", (line, e)
EOF
run "$CLI" cache ls --json
json_check "cache ls --json: no index entries" "$T/out" 'd and not any(r["internal"] for r in d)'
run "$CLI" cache ls --json --all
json_check "cache ls --json --all: index entries marked" "$T/out" 'any(r["internal"] for r in d)'
run "$CLI" cache info --all
expect "--all is for ls" 2 "" "--all is for ls"

# --- cache ls --remote fails before printing --------------------------------
run "$CLI" cache ls --remote
expect "cache ls --remote without a remote" 1 "" "no remote cache"
check "  prints nothing on stdout" test ! -s "$T/out"

# --- warm --opt of cached sources says what it built -------------------------
export OPJIT_CACHE_DIR="$T/warm"
run "$CLI" warm add1
expect "warm" 0 "1 compiled"
check "  built the libtcc code" grep -qE "^compiled $OPS/add1.c \([0-9.]+ ms: tcc\)$" "$T/out"
run "$CLI" warm --opt add1
expect "warm --opt of a cached source" 0 "0 cache hits, 1 compiled"
check "  built the optimized code, and only it" \
    grep -qE "^compiled $OPS/add1.c \([0-9.]+ ms: opt\)$" "$T/out"
run "$CLI" warm --opt add1
expect "warm --opt again" 0 "1 cache hits, 0 compiled"
check "  a hit says nothing was built" grep -qxF "hit      $OPS/add1.c" "$T/out"
export OPJIT_CACHE_DIR="$T/cache"

# --- a load that waited for another process's compile says so ----------------
# Another process "compiling": the build lock of add1's libtcc entry is held
# (a POSIX lock conflicts with opjit's OFD locks) while the entry appears.
"$CLI" --cache "$T/lockc" cache info >/dev/null
key=$("$CLI" cache why --json add1 | python3 -c 'import json, sys
print([r["key"] for r in json.load(sys.stdin) if r["compiler"] == "tcc"][0])' || true)
check "the key of add1's libtcc code (cache why --json)" test ${#key} = 32
[[ ${#key} == 32 ]] || key=${OPJIT_TEST_KEY:-none}
run python3 - "$CLI" "$T/lockc" "$OPJIT_CACHE_DIR" "$key" "$T/waited.out" <<'EOF'
import fcntl, os, shutil, subprocess, sys, time
cli, cache, built, key, out = sys.argv[1:]
fd = os.open(os.path.join(cache, "v1", "locks", key), os.O_RDWR | os.O_CREAT, 0o600)
fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0)
with open(out, "w") as f:
    src = os.path.join(os.environ["OPJIT_OPS_PATH"], "add1.c")
    p = subprocess.Popen([cli, "--cache", cache, "load", src], stdout=f, stderr=f)
    time.sleep(2.0)  # the load is waiting by then, even under a sanitizer
    shard = os.path.join(cache, "v1", "entries", key[:2])
    os.makedirs(shard, exist_ok=True)
    tmp = os.path.join(shard, ".t" + key)
    shutil.copytree(os.path.join(built, "v1", "entries", key[:2], key), tmp)
    os.rename(tmp, os.path.join(shard, key))
    os.close(fd)
    sys.exit(p.wait())
EOF
expect "a load behind another process's build lock" 0
check "  is a cache hit" grep -q "add1.c: cache hit" "$T/waited.out"
check "  that says it waited" \
    grep -qE "^    waited (0\.[5-9]|[1-9])[0-9.]* s for another process.s compile$" "$T/waited.out"
check "  and compiled nothing" grep -q "compile 0.00 ms" "$T/waited.out"

# --- watch: a compile error once, one spelling of the path --------------------
mkdir -p "$T/w/wops"
printf '#include <opjit_op.h>\nint f( {\n' >"$T/w/wops/bad.c"
(cd "$T/w" && exec "$CLI" --cache "$T/wc" watch --ops-path wops >"$T/w/out" 2>"$T/w/err") &
wpid=$!
for _ in $(seq 100); do grep -q '^watching' "$T/w/out" 2>/dev/null && break; sleep 0.1; done
printf '#include <opjit_op.h>\nint g( {\n' >"$T/w/wops/bad.c"
for _ in $(seq 100); do [[ $(grep -c '^failed' "$T/w/out") -ge 2 ]] && break; sleep 0.1; done
sleep 0.5 # anything else it would print
kill -INT "$wpid"
wait "$wpid" || true
check "watch: two failures reported" test "$(grep -c '^failed' "$T/w/out")" = 2
check "  each under the same absolute path" \
    test "$(grep -c "^failed $T/w/wops/bad.c: " "$T/w/out")" = 2
check "  each with its diagnostics on lines of their own" \
    test "$(grep -c "^    $T/w/wops/bad.c:2: error: " "$T/w/out")" = 2
check "  each error once (not again on stderr)" \
    test "$(cat "$T/w/out" "$T/w/err" | grep -c 'identifier expected')" = 2

# --- --arch names itself -------------------------------------------------------
run "$CLI" warm --arch banana add1
expect "warm --arch banana" 2 "" "--arch: 'banana' is not a CUDA architecture"
check "  names the flag, not the config field" test "$(grep -c cuda_archs "$T/err")" = 0
run "$CLI" cache why --arch sm_80,banana add1
expect "cache why --arch banana" 2 "" "--arch: 'banana'"

# --- NVRTC's diagnostics name the file once per line -------------------------
mkdir -p "$T/cu"
cat >"$T/cu/badk.cu" <<'EOF'
#ifdef __CUDACC_RTC__
extern "C" __global__ void k(float *x) { x[0] = undefined_thing; }
#else
#include <opjit_op.h>
static int f(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }
OPJIT_MODULE(badk, m) { opjit_def(m, "badk(Tensor x) -> Tensor", OPJIT_CUDA, f, ""); }
#endif
EOF
run "$CLI" load "$T/cu/badk.cu"
if grep -q "compile error (NVRTC" "$T/err"; then
    expect "a .cu that does not compile" 1 "" "badk.cu:2: error"
    check "  its name: in the header and the diagnostic only" \
        test "$(grep -o badk.cu "$T/err" | wc -l)" = 2
else
    echo "no NVRTC here: its diagnostics not checked" >&2
fi

# --- --device cuda on a CPU-only op -------------------------------------------
run "$CLI" call add1 --device cuda x=@"$T/v.npy"
expect "--device cuda on a CPU-only op" 1 "" "add1 has no CUDA kernel: it runs on cpu"
check "  does not blame the driver" test "$(grep -c 'libcuda\|driver' "$T/err")" = 0

# --- without a GPU: the CUDA sources skipped are said once, at -v ---------------
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    run env OPJIT_OPS_PATH="$SHIPPED" "$CLI" --cache "$T/nogpu" call no_such_op
    expect "a miss by name without a GPU" 1 "" "no source for op 'no_such_op'"
    check "  no word of the skipped CUDA sources" test "$(grep -c skipped "$T/err")" = 0
    run env OPJIT_OPS_PATH="$SHIPPED" "$CLI" -v --cache "$T/nogpu2" call no_such_op
    expect "the same at -v" 1 "" "skipped"
    check "  said once" test "$(grep -c skipped "$T/err")" = 1
else
    echo "libcuda.so.1 is here: the no-GPU messages not checked" >&2
fi

echo "test_cli_consistent: $passed passed, $failed failed"
[[ $failed == 0 ]]
