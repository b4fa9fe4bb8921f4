# tests/cli_lib.sh - the harness the CLI tests share. Source it; need_cli
# and fresh_tmp set $CLI and $T (a scratch directory). run CMD... keeps the
# exit status in $rc, stdout in $T/out and stderr in $T/err; expect checks
# them; pass/fail count; check WHAT CMD... passes when CMD succeeds; npy and
# friends write .npy files from the shell. Under -fsanitize a finding must
# not pass for an expected exit 1.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}exitcode=86"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}exitcode=86:print_stacktrace=1"

# need_cli: $CLI, the opjit tool ctest names in $OPJIT_CLI; without one the
# test is skipped (exit 77).
need_cli() {
    if [[ -z "${OPJIT_CLI:-}" || ! -x "${OPJIT_CLI}" ]]; then
        echo "OPJIT_CLI is not set to the opjit tool; skipping" >&2
        exit 77
    fi
    CLI=$OPJIT_CLI
}

# fresh_tmp: $T, an empty scratch directory ($OPJIT_TEST_TMP, else a new one).
fresh_tmp() {
    T=${OPJIT_TEST_TMP:-$(mktemp -d)}
    rm -rf "$T"
    mkdir -p "$T"
}

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

check() { # check WHAT COMMAND...: passes when the command succeeds
    local what=$1
    shift
    if "$@"; then pass; else fail "$what"; fi
}

# --- .npy files from the shell -------------------------------------------------

# le BYTES VALUE: VALUE as BYTES little-endian bytes, as printf escapes.
le() {
    local n=$1 v=$2 i s=""
    for ((i = 0; i < n; i++)); do
        s+=$(printf '\\x%02x' $(((v >> (8 * i)) & 255)))
    done
    printf '%s' "$s"
}

# f32 N: the IEEE float32 bits of the integer N (|N| < 2^24), as escapes.
f32() {
    local n=$1 sign=0 e=0 bits
    if ((n < 0)); then
        sign=1
        n=$((-n))
    fi
    if ((n == 0)); then
        bits=$((sign << 31))
    else
        while (((n >> (e + 1)) > 0)); do e=$((e + 1)); done
        bits=$(((sign << 31) | ((e + 127) << 23) | ((n << (23 - e)) & 0x7fffff)))
    fi
    le 4 "$bits"
}

# npy FILE DESCR SHAPE DATA-ESCAPES: a .npy 1.0 file as numpy writes it.
npy() {
    local file=$1 descr=$2 shape=$3 data=$4
    local dict="{'descr': '$descr', 'fortran_order': False, 'shape': $shape, }"
    local total=$((10 + ${#dict} + 1))
    local pad=$(((64 - total % 64) % 64))
    local hlen=$((${#dict} + pad + 1))
    {
        printf '\x93NUMPY\x01\x00'
        printf "$(le 2 $hlen)"
        printf '%s' "$dict"
        printf "%${pad}s" ''
        printf '\n'
        printf "$data"
    } >"$file"
}

# npy_f32 FILE SHAPE V...: float32 array of integer values.
npy_f32() {
    local file=$1 shape=$2 data="" v
    shift 2
    for v in "$@"; do data+=$(f32 "$v"); done
    npy "$file" '<f4' "$shape" "$data"
}

# npy_i64 FILE SHAPE V...
npy_i64() {
    local file=$1 shape=$2 data="" v
    shift 2
    for v in "$@"; do data+=$(le 8 "$v"); done
    npy "$file" '<i8' "$shape" "$data"
}

# npy_data_hex FILE: the data bytes of a .npy 1.0 file, as hex.
npy_data_hex() {
    local hlen
    hlen=$(od -An -tu2 -j8 -N2 "$1" | tr -d ' ')
    tail -c +$((10 + hlen + 1)) "$1" | od -An -v -tx1 | tr -d ' \n'
}

# hex_f32 V...: what npy_data_hex shows for these float32 values.
hex_f32() {
    local v s=""
    for v in "$@"; do s+=$(f32 "$v"); done
    printf "$s" | od -An -v -tx1 | tr -d ' \n'
}
