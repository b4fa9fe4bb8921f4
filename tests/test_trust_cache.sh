#!/usr/bin/env bash
# tests/test_trust_cache.sh - issue 20, through the `opjit` command:
#   11. the cache never follows a symbolic link below a layer's root (a
#       shard, an entry, v1/entries; in the writable cache and in a
#       read-only layer): loads never write or load through one, and
#       `cache verify --repair` never deletes outside the cache;
#   20. names from disk (file names, docs) are printed escaped by `opjit
#       list`, `cache ls` and `cache verify`; a cache removed during an
#       optimizing compile says why the compile failed.
#
# Env (set by ctest): OPJIT_CLI, OPJIT_OPS_PATH, OPJIT_TEST_TMP, OPJIT_CC.
set -euo pipefail

. "$(dirname "$0")/cli_lib.sh"
need_cli
fresh_tmp
OPS=${OPJIT_OPS_PATH:?OPJIT_OPS_PATH must name ops-src}
CC_REAL=${OPJIT_CC:-cc}
unset OPJIT_CC OPJIT_TIERING OPJIT_OFFLINE OPJIT_CACHE_READONLY
export OPJIT_TIERING=0

fresh() {
    rm -rf "$T/cache-$1"
    export OPJIT_CACHE_DIR="$T/cache-$1"
}
# The directory of nms.c's libtcc entry in cache $1.
nms_entry() {
    dirname "$(grep -l '^source nms.c$' "$1"/v1/entries/*/*/manifest | head -1)"
}
count() { find "$1" -mindepth 1 | wc -l; }

# --- 11. a symbolic link as a shard of the writable cache -------------------------
fresh shard
run "$CLI" load "$OPS/nms.c"
expect "nms.c is cached" 0 "[tcc]"
entry=$(nms_entry "$OPJIT_CACHE_DIR")
shard=$(dirname "$entry")
key=$(basename "$entry")
V="$T/victim"
mkdir -m 700 "$V"
rm -rf "$shard" && ln -s "$V" "$shard"
run "$CLI" load "$OPS/nms.c"
expect "a load through a symlinked shard still works" 0 "[tcc]" "symbolic link"
check "  and wrote nothing where the link points" test "$(count "$V")" = 0
check "  and the shard is a directory again (the link itself removed)" \
    bash -c "test -d '$shard' && test ! -L '$shard'"
check "  and the entry is back in the cache" test -f "$shard/$key/manifest"

# What the link points at looks like a damaged entry: verify --repair
# reports the link and unlinks it, and leaves the directory outside the
# cache alone (it once moved it into the cache and deleted it).
fresh repair
run "$CLI" load "$OPS/nms.c"
entry=$(nms_entry "$OPJIT_CACHE_DIR")
shard=$(dirname "$entry")
rm -rf "$V" && mkdir -m 700 "$V" && cp -a "$entry" "$V/"
printf 'x' >>"$V/$key/host.so"
rm -rf "$shard" && ln -s "$V" "$shard"
run "$CLI" cache ls
expect "cache ls names the symlinked shard" 0 "DAMAGED" ""
check "  as a symbolic link" grep -q "symbolic link" "$T/out"
run "$CLI" cache verify --repair
expect "verify --repair of a symlinked shard" 1 "symbolic link"
check "  keeps the directory outside the cache" test -f "$V/$key/manifest"
check "  and removes the link" test ! -e "$shard"
run "$CLI" cache verify
expect "  after which the cache verifies" 0 "0 damaged"
ln -s "$V" "$shard"
run "$CLI" cache clear
expect "cache clear with a symlinked shard" 0
check "  removes the link" test ! -e "$shard"
check "  and nothing it pointed at" test -f "$V/$key/manifest"

# --- 11. a symbolic link as an entry ----------------------------------------------
fresh entry
run "$CLI" load "$OPS/nms.c"
entry=$(nms_entry "$OPJIT_CACHE_DIR")
rm -rf "$V" && mkdir -m 700 "$V" && cp -a "$entry" "$V/"
key=$(basename "$entry")
rm -rf "$entry" && ln -s "$V/$key" "$entry"
run "$CLI" cache verify --repair
expect "verify --repair of a symlinked entry" 1 "symbolic link"
check "  keeps the directory it pointed at" test -f "$V/$key/manifest"
check "  and removes the link" test ! -e "$entry"

# --- 11. v1/entries itself a link: the cache is not used ------------------------
fresh entries
run "$CLI" load "$OPS/nms.c"
W="$T/elsewhere"
rm -rf "$W" && mv "$OPJIT_CACHE_DIR/v1/entries" "$W"
ln -s "$W" "$OPJIT_CACHE_DIR/v1/entries"
before=$(count "$W")
run "$CLI" load "$OPS/mm.c"
expect "a load with v1/entries a link still works" 0 "[tcc]" "symbolic link"
check "  and nothing was written through it" test "$(count "$W")" = "$before"

# --- 11. a read-only layer whose shard is a link ------------------------------------
fresh ro-src
run "$CLI" load "$OPS/nms.c"
R="$T/layer"
rm -rf "$R" "$V" && mkdir -p "$R/v1" && mkdir -m 700 "$V"
cp -a "$OPJIT_CACHE_DIR/v1/entries" "$R/v1/"
entry=$(nms_entry "$R")
mv "$(dirname "$entry")"/* "$V/" && rmdir "$(dirname "$entry")"
ln -s "$V" "$(dirname "$entry")"
fresh ro-use
run env OPJIT_CACHE_READONLY="$R" OPJIT_OFFLINE=1 "$CLI" load "$OPS/nms.c"
expect "an entry behind a link in a read-only layer is not served" 1 "" "offline"
run env OPJIT_CACHE_READONLY="$R" "$CLI" cache verify
expect "  verify reports it" 1 "symbolic link"
check "  and leaves it alone" test -d "$V/$(basename "$entry")"

# --- 20. names from disk are printed escaped ----------------------------------------
fresh names
D="$T/evil-ops"
rm -rf "$D" && mkdir -p "$D"
name=$'ev\e[2Jil\nx.c'
cat >"$D/$name" <<'EOF'
#include <opjit_op.h>
static int k(opjit_ctx *ctx, opjit_args *a) { (void)ctx; (void)a; return 0; }
OPJIT_MODULE(evil, m) {
    opjit_def(m, "evil_op(Tensor x) -> Tensor", OPJIT_CPU, k, "doc \033]0;title\007 end");
}
EOF
run "$CLI" list --ops-path "$D"
expect "opjit list of a source named with escapes" 0 'ev\x1b[2Jil\nx.c'
check "  prints no ESC or BEL byte" bash -c "! grep -q \$'[\\e\\a]' '$T/out'"
check "  escapes the doc too" grep -qF 'doc \x1b]0;title\x07 end' "$T/out"
run "$CLI" load "$D/$name"
expect "  it loads" 0
run "$CLI" cache ls
expect "cache ls of it" 0 'ev\x1b[2Jil\nx.c'
check "  prints no ESC byte" bash -c "! grep -q \$'\\e' '$T/out'"
check "  and every line is a whole row" bash -c "! grep -qvE '^(KEY|[0-9a-f]{32}) ' '$T/out'"

# --- 20. a cache removed during an optimizing compile says why --------------------
fresh removed
cat >"$T/slowcc" <<EOF
#!/bin/sh
case "\$*" in *--version*) exec "$CC_REAL" --version;; esac
sleep 2
exec "$CC_REAL" "\$@"
EOF
chmod +x "$T/slowcc"
(sleep 1; rm -rf "$OPJIT_CACHE_DIR") &
run env OPJIT_TIERING=1 OPJIT_CC="$T/slowcc" "$CLI" load --wait "$OPS/nms.c"
wait
expect "a cache removed mid-compile: the load still works" 0 "[tcc]" "no longer exists"
check "  and the warning says how the compiler failed" grep -q "exit status" "$T/err"
check "  with its own words" grep -q "No such file or directory" "$T/err"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
