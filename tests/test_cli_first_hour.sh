#!/usr/bin/env bash
# tests/test_cli_first_hour.sh - what a new user meets first (issue 24):
# a HOME that does not exist (daemon users: HOME=/nonexistent) is never
# created; opjit warns once and works without a cache.
#
# Env (set by ctest): OPJIT_CLI, OPJIT_OPS_PATH, OPJIT_TEST_TMP.
set -euo pipefail

. "$(dirname "$0")/cli_lib.sh"
need_cli
fresh_tmp
OPS=${OPJIT_OPS_PATH:?OPJIT_OPS_PATH must name ops-src}
unset OPJIT_TIERING OPJIT_OFFLINE OPJIT_CACHE_READONLY OPJIT_CACHE_DIR XDG_CACHE_HOME

run env HOME="$T/nohome" "$CLI" load "$OPS/nms.c"
expect "a load with a HOME that does not exist works" 0 "compiled" \
    "the home directory $T/nohome does not exist"
check "  and the home directory was not created" test ! -e "$T/nohome"
check "  and it warned once" test "$(grep -c warning "$T/err")" = 1

mkdir -p "$T/home"
run env HOME="$T/home" "$CLI" load "$OPS/nms.c"
expect "a HOME that exists gets ~/.cache/opjit" 0 "compiled"
check "  made under it" test -d "$T/home/.cache/opjit/v1/entries"

# A mistyped op name gets a suggestion; a search path entry that is not a
# directory gets a warning.
run "$CLI" call --ops-path "$OPS" nsm
expect "a mistyped op name fails" 1 "" "did you mean 'nms'?"
run "$CLI" call --ops-path "$OPS" zzzzzz
expect "a name near nothing" 1 "" "no source for op 'zzzzzz'"
check "  has no suggestion" test "$(grep -c 'did you mean' "$T/err")" = 0
run env OPJIT_OPS_PATH="$T/no-such-dir" "$CLI" call --ops-path "$T/typo" "$OPS/nms.c" \
    boxes=@"$T/b.npy"
check "--ops-path that is not there: a warning" \
    grep -q "the configured ops path names $T/typo, which is not there" "$T/err"
check "OPJIT_OPS_PATH that is not there: a warning" \
    grep -q "OPJIT_OPS_PATH names $T/no-such-dir, which is not there" "$T/err"

# The man page, made from the help texts, installed with the tool.
MAN=${OPJIT_BINARY_DIR:?}/opjit.1
check "the build made opjit.1" test -s "$MAN"
for cmd in list load call warm cache watch; do
    check "  it has a section for opjit $cmd" grep -q "^\.SS $cmd\$" "$MAN"
done
if command -v man >/dev/null; then
    run man --warnings -l "$MAN"
    expect "  man renders it" 0 "opjit warm"
    check "  without warnings" test ! -s "$T/err"
fi

echo "test_cli_first_hour: $passed passed, $failed failed"
[[ $failed == 0 ]]
