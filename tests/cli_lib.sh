# tests/cli_lib.sh - the harness the CLI tests share. Source it after
# setting T (a scratch directory): run CMD... keeps the exit status in $rc,
# stdout in $T/out and stderr in $T/err; expect checks them; pass/fail
# count. Under -fsanitize a finding must not pass for an expected exit 1.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}exitcode=86"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}exitcode=86:print_stacktrace=1"

passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() {
    failed=$((failed + 1))
    echo "FAIL: $*" >&2
}
# fail_run WHAT: a failure of the last run, with what it printed.
fail_run() {
    fail "$@"
    echo "  command: ${last_cmd:-}" >&2
    echo "  exit: ${rc:-} stdout:" >&2
    sed 's/^/    /' "$T/out" >&2 || true
    echo "  stderr:" >&2
    sed 's/^/    /' "$T/err" >&2 || true
}

# run CMD...: runs it, keeping its exit status in $rc, stdout in $T/out,
# stderr in $T/err.
run() {
    last_cmd="$*"
    set +e
    "$@" >"$T/out" 2>"$T/err"
    rc=$?
    set -e
}

# expect WHAT RC [stdout-substring] [stderr-substring]
expect() {
    local what=$1 want=$2 out=${3:-} err=${4:-}
    if grep -qE 'Sanitizer|runtime error:' "$T/err"; then
        fail_run "$what: a sanitizer finding"
    elif [[ "$rc" != "$want" ]]; then
        fail_run "$what: exit $rc, expected $want"
    elif [[ -n "$out" ]] && ! grep -qF -- "$out" "$T/out"; then
        fail_run "$what: stdout lacks '$out'"
    elif [[ -n "$err" ]] && ! grep -qF -- "$err" "$T/err"; then
        fail_run "$what: stderr lacks '$err'"
    else
        pass
    fi
}
