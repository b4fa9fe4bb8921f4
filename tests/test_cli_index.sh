#!/usr/bin/env bash
# tests/test_cli_index.sh - ops found by name in any module, from the
# command line: `opjit call rmsnorm` with samples/ops/llama_ops.c (which
# registers rmsnorm, softmax and matvec), module::op names, two modules
# defining one op, a module whose init crashes; and `opjit watch`, which
# prints one line per event (loaded, reloaded, failed with file:line,
# removed) and exits 0 on SIGINT and SIGTERM.
#
# Env (set by ctest): OPJIT_CLI, OPJIT_SOURCE_DIR, OPJIT_TEST_TMP,
# OPJIT_CACHE_DIR.
set -euo pipefail

. "$(dirname "$0")/cli_lib.sh"
need_cli
fresh_tmp
export OPJIT_CACHE_DIR=${OPJIT_CACHE_DIR:-$T/cache}
export OPJIT_OPS_PATH= # only the directories named here
export OPJIT_DISCOVER_TIMEOUT=2
SRC=${OPJIT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}

mkdir -p "$T/ops"
cp "$SRC/samples/ops/llama_ops.c" "$T/ops/"
npy_f32 "$T/x.npy" '(2, 2)' 3 4 0 0
npy_f32 "$T/w.npy" '(2,)' 1 2
npy_f32 "$T/v.npy" '(2,)' 1 1

# --- an op of a multi-op module, by its name -----------------------------------

run "$CLI" call matvec --ops-path "$T/ops" a=@"$T/x.npy" x=@"$T/v.npy"
expect "call matvec of llama_ops.c" 0 "[7. 0.]"
run "$CLI" call softmax --ops-path "$T/ops" x=@"$T/w.npy"
expect "call softmax of llama_ops.c" 0 "output 0: shape (2,)"
run "$CLI" call llama_ops::rmsnorm --ops-path "$T/ops" x=@"$T/x.npy" weight=@"$T/w.npy"
expect "call llama_ops::rmsnorm" 0 "output 0: shape (2, 2)"
run "$CLI" call llama_ops::nms --ops-path "$T/ops"
expect "a module without the op" 1 "" "module 'llama_ops' registers no op 'nms'"

# --- a name is the op of that name, never another op of the file (#20.9) -------

mkdir -p "$T/gops"
printf '#include <opjit_op.h>\nstatic int k(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }\nOPJIT_MODULE(g, m) { opjit_def(m, "relu() -> Tensor", OPJIT_CPU, k, ""); }\n' \
    >"$T/gops/gelu.c"
run "$CLI" call gelu --ops-path "$T/gops"
expect "gelu.c registering only relu" 1 "" "gelu.c registers relu"

# --- an earlier directory's module beats a later file named after the op (#20.17)

mkdir -p "$T/over"
sed 's/OPJIT_MODULE(llama_ops/OPJIT_MODULE(my_override/; s/"matvec(/"mm(/' \
    "$T/ops/llama_ops.c" >"$T/over/my_override.c"
run "$CLI" call mm --ops-path "$T/over:$SRC/ops-src" a=@"$T/x.npy" x=@"$T/v.npy"
expect "my_override::mm in an earlier directory" 0 "[7. 0.]"

# --- a crashing init is reported, the others still found -----------------------

printf '#include <opjit_op.h>\nOPJIT_MODULE(c, m) { (void)m; *(volatile int *)0 = 1; }\n' \
    >"$T/ops/crashy.c"
run "$CLI" call matvec --ops-path "$T/ops" a=@"$T/x.npy" x=@"$T/v.npy"
expect "matvec beside a crashing init" 0 "[7. 0.]"
run "$CLI" call no_such_op --ops-path "$T/ops"
expect "an unknown op names the crashing source" 1 "" "crashy.c: loading it" # crashed, or exited under a sanitizer

# --- two modules defining one op -----------------------------------------------

sed 's/OPJIT_MODULE(llama_ops/OPJIT_MODULE(other_ops/' "$T/ops/llama_ops.c" >"$T/ops/other_ops.c"
run "$CLI" call softmax --ops-path "$T/ops" x=@"$T/w.npy"
expect "two modules define softmax" 1 "" "llama_ops::softmax or other_ops::softmax"
run "$CLI" call other_ops::softmax --ops-path "$T/ops" x=@"$T/w.npy"
expect "the qualified name settles it" 0 "output 0: shape (2,)"
rm "$T/ops/other_ops.c" "$T/ops/crashy.c"

# --- a warm `opjit list` starts no process (#23) --------------------------------

# A cache of its own: a listing reports each source's tier as the cache
# holds it, and the optimizing compile an earlier call of llama_ops.c left
# running could land between the two listings (it did at load 4).
main_cache=$OPJIT_CACHE_DIR
export OPJIT_CACHE_DIR=$T/list-cache
mkdir -p "$T/lops"
cp "$SRC/samples/ops/llama_ops.c" "$T/lops/"
printf '#include <opjit_op.h>\nOPJIT_MODULE(c, m) { (void)m; *(volatile int *)0 = 1; }\n' \
    >"$T/lops/crashy.c"
run "$CLI" list --ops-path "$T/lops"
expect "list: cold" 1 "rmsnorm(" "crashy.c: loading it"
cp "$T/out" "$T/list1.out"
cp "$T/err" "$T/list1.err"
if command -v strace >/dev/null && strace -f -o /dev/null true 2>/dev/null; then
    # LeakSanitizer cannot run under ptrace (a sanitizer build's tool).
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
        run strace -f -e trace=clone,clone3,fork,vfork -o "$T/list.strace" \
        "$CLI" list --ops-path "$T/lops"
    expect "list: warm" 1 "rmsnorm(" "crashy.c: loading it"
    check "list: warm, no process started" test "$(grep -cE 'clone|fork' "$T/list.strace")" = 0
else
    run "$CLI" list --ops-path "$T/lops"
    expect "list: warm" 1 "rmsnorm(" "crashy.c: loading it"
fi
check "list: warm, the same rows" cmp -s "$T/out" "$T/list1.out"
cmp -s "$T/out" "$T/list1.out" || diff "$T/list1.out" "$T/out" | head -20 | sed 's/^/    | /' >&2
check "list: warm, the same messages" cmp -s "$T/err" "$T/list1.err"
export OPJIT_CACHE_DIR=$main_cache

# --- opjit watch -----------------------------------------------------------------

# wait_for PATTERN: until the watch output has a line matching it (10 s).
wait_for() {
    for _ in $(seq 100); do
        if grep -qE "$1" "$T/watch.out"; then return 0; fi
        sleep 0.1
    done
    return 1
}

mkdir -p "$T/wops"
cp "$SRC/samples/ops/llama_ops.c" "$T/wops/"
for sig in INT TERM; do
    : >"$T/watch.out"
    "$CLI" watch --ops-path "$T/wops" >"$T/watch.out" 2>"$T/watch.err" &
    pid=$!
    check "watch: loaded ($sig)" wait_for '^loaded .*llama_ops.c: rmsnorm, softmax, matvec$'
    check "watch: watching ($sig)" wait_for '^watching '
    if [[ $sig == INT ]]; then
        # An editor-like save: truncate, then write in pieces.
        sed 's/RMS normalization/RMS norm/' "$T/wops/llama_ops.c" >"$T/new.c"
        : >"$T/wops/llama_ops.c"
        head -c 500 "$T/new.c" >>"$T/wops/llama_ops.c"
        sleep 0.005
        tail -c +501 "$T/new.c" >>"$T/wops/llama_ops.c"
        check "watch: reloaded" wait_for '^reloaded .*llama_ops.c \([0-9.]+ ms\)$'
        sleep 0.3
        check "watch: one reload for the burst" test "$(grep -c '^reloaded' "$T/watch.out")" = 1
        printf 'int broken = ;\n' >>"$T/wops/llama_ops.c"
        check "watch: failed with file:line" wait_for 'llama_ops.c:[0-9]+: error'
        printf '#include <opjit_op.h>\nstatic int k(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }\nOPJIT_MODULE(n, m) { opjit_def(m, "new_op() -> Tensor", OPJIT_CPU, k, ""); }\n' \
            >"$T/wops/new_mod.c"
        check "watch: a new source is loaded" wait_for '^loaded .*new_mod.c: new_op$'
        rm "$T/wops/new_mod.c"
        check "watch: removed" wait_for '^removed .*new_mod.c$'
    fi
    kill -$sig $pid
    set +e
    wait $pid
    rc=$?
    set -e
    check "watch: exit 0 on SIG$sig (got $rc)" test $rc = 0
    if grep -qE 'Sanitizer|runtime error:' "$T/watch.err"; then fail "watch: a sanitizer finding"; fi
    cp "$SRC/samples/ops/llama_ops.c" "$T/wops/"
done

echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
