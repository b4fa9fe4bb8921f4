# tests/remote_lib.sh - what the remote cache tests share (source it after
# cli_lib.sh, need_cli and fresh_tmp): a real redis-server on 127.0.0.1
# with a free port and a unix socket, nothing saved, stopped by its PID;
# a fleet key; sources nobody has built.
#
# need_redis: skip (77) without redis-server and redis-cli.
need_redis() {
    if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
        echo "redis-server (Debian package redis-server) is not installed; skipping" >&2
        exit 77
    fi
}

REDIS_PID=
free_port() {
    /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
PORT=$(free_port)
SOCK=$T/redis.sock

rcli() { redis-cli -p "$PORT" "$@"; }

# start_redis [ARGS...]: a server on $PORT and $SOCK, waited for.
start_redis() {
    redis-server --port "$PORT" --bind 127.0.0.1 --unixsocket "$SOCK" --unixsocketperm 700 \
        --save '' --appendonly no --dir "$T" --logfile "$T/redis.log" "$@" &
    REDIS_PID=$!
    for _ in $(seq 100); do
        rcli PING 2>/dev/null | grep -q PONG && return 0
        sleep 0.05
    done
    echo "redis-server did not start:" >&2
    cat "$T/redis.log" >&2
    exit 1
}
stop_redis() {
    if [[ -n "$REDIS_PID" ]]; then
        kill -CONT "$REDIS_PID" 2>/dev/null || true
        kill -KILL "$REDIS_PID" 2>/dev/null || true
        wait "$REDIS_PID" 2>/dev/null || true
        REDIS_PID=
    fi
}

# fleet_keys: $T/fleet.key (exported as the fleet key) and $T/other.key.
fleet_keys() {
    head -c 32 /dev/urandom >"$T/fleet.key"
    head -c 32 /dev/urandom >"$T/other.key"
    chmod 600 "$T/fleet.key" "$T/other.key"
    export OPJIT_REMOTE_KEY_FILE=$T/fleet.key
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# count PATTERN FILE: lines of FILE holding the fixed string.
count() { grep -cF -- "$1" "$2" || true; }

# cold_source FILE TAG [OP]: a source with a key nobody has built: OP.c
# (nms.c) with a unique comment, as FILE, and the headers beside it.
cold_source() {
    mkdir -p "$(dirname "$1")"
    { echo "/* $2 $RANDOM$RANDOM $(date +%s%N) */"; cat "$OPS/${3:-nms}.c"; } >"$1"
    cp "$OPS"/*.h "$(dirname "$1")/"
}

# tcc_key FILE: the cache key of FILE's libtcc build, found by building it
# in a scratch cache without the remote.
tcc_key() {
    env OPJIT_CACHE_DIR="$T/keyprobe-$RANDOM$RANDOM" OPJIT_REMOTE_CACHE= OPJIT_TIERING=0 \
        "$CLI" load -v "$1" 2>&1 >/dev/null |
        grep -oE "$(basename "$1") tcc \([^,]+, [0-9a-f]{32}\)" | grep -oE "[0-9a-f]{32}"
}
