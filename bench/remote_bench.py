"""bench/remote_bench.py - the remote cache layer (`bench/run --only remote`):
a remote hit against a local cold compile, in fresh processes, on a
redis-server started here on 127.0.0.1 (a free port, nothing saved), with
signed entries (a fleet key made here).

Per source and repetition, each in a fresh process (`opjit_bench load-once`)
with an empty local cache, OPJIT_TIERING=0:
  cold    the remote off: compile, publish locally (the anchor)
  publish the remote on, empty: compile, publish locally and to Redis
  remote  the remote on, holding the entry: fetch, verify, install, load
  local   the same cache again: a local hit (for reference)
"fetch" is the time opjit_load_file spent getting the artifacts (its
total less hashing the key and dlopen + init): for a remote hit, GET +
signature + writing the files + checks + rename; for a local hit, the
checks of the entry.
"""
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

SOURCES = [("ops-src/nms.c", {}), ("ops-src/conv2d.c", {}),
           ("ops-src/nms.cu", {"OPJIT_CUDA_ARCHS": "sm_90"})]


class Redis:
    def __init__(self, tmp):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tmp, "--logfile", os.path.join(tmp, "redis.log")])
        for _ in range(100):
            if self.cli("PING").strip() == "PONG":
                return
            time.sleep(0.05)
        self.close()
        raise RuntimeError("redis-server did not start")

    def cli(self, *args):
        p = subprocess.run(["redis-cli", "-p", str(self.port)] + list(args),
                           capture_output=True, text=True)
        return p.stdout

    def close(self):
        self.proc.kill()
        self.proc.wait()


def load_once(exe, root, src, env, parse):
    t0 = time.perf_counter()
    p = subprocess.run([exe, "load-once", src], cwd=root, env=env, capture_output=True,
                       text=True, timeout=600)
    wall = (time.perf_counter() - t0) * 1e3
    line = (p.stdout.strip().splitlines() or ["err no output"])[0]
    if not line.startswith("ok"):
        raise RuntimeError("%s: %s %s" % (src, line, p.stderr.strip()[-300:]))
    d = parse(line, 1)
    d["wall_ms"] = wall
    # the library's own timing of each remote hit: (bytes, ms)
    d["entries"] = [(int(b), float(ms)) for b, ms in
                    re.findall(r"remote hit [0-9a-f]{32}: (\d+) bytes in ([0-9.]+) ms", p.stderr)]
    d["fetch_ms"] = d["load_ms"] - d["key_ms"] - d["dlopen_init_ms"] - d["compile_ms"]
    return d


def artifact_bytes(cache):
    """Bytes of the artifacts (not manifests, not notes) an entry tree holds."""
    n = 0
    for dirpath, _, files in os.walk(os.path.join(cache, "v1", "entries")):
        for f in files:
            if f not in ("manifest", "key", "identity"):
                n += os.path.getsize(os.path.join(dirpath, f))
    return n


def one_rep(exe, root, src, extra, base_env, tmp, r, parse):
    env = dict(base_env, **extra)
    out = {}
    for step, remote in (("cold", False), ("publish", True), ("remote", True), ("local", True)):
        cache = os.path.join(tmp, "c-%d-%s" % (r, "remote" if step == "local" else step))
        e = dict(env, OPJIT_CACHE_DIR=cache)
        if not remote:
            e["OPJIT_REMOTE_CACHE"] = ""
        out[step] = load_once(exe, root, src, e, parse)
        if step == "remote":
            out["bytes"] = artifact_bytes(cache)
    return out


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def bench(exe, root, reps, log, parse):
    """parse(line, skip): bench.py's parser of k=v fields."""
    if not shutil.which("redis-server"):
        return {"error": "redis-server is not installed (Debian package redis-server)"}
    tmp = tempfile.mkdtemp(prefix="opjit-remote-bench-")
    res = {}
    try:
        srv = Redis(tmp)
        key = os.path.join(tmp, "fleet.key")
        with open(key, "wb") as f:
            f.write(os.urandom(32))
        os.chmod(key, 0o600)
        base_env = dict(os.environ, OPJIT_TIERING="0", OPJIT_REMOTE_KEY_FILE=key, OPJIT_BENCH_LOG="1",
                        OPJIT_REMOTE_CACHE="redis://127.0.0.1:%d" % srv.port)
        try:
            for src, extra in SOURCES:
                name = os.path.basename(src)
                log("remote: %s (%d reps, fresh processes, Redis on loopback)" % (src, reps))
                rows = []
                try:
                    for r in range(reps + 1):
                        srv.cli("FLUSHALL")
                        rows.append(one_rep(exe, root, src, extra, base_env, tmp, r, parse))
                except RuntimeError as e:
                    res[name] = {"error": str(e)[:300]}
                    continue
                rows = rows[1:]  # the first warms the page cache
                d = {"reps": len(rows), "bytes": rows[-1]["bytes"]}
                for step in ("cold", "publish", "remote", "local"):
                    for k in ("total_ms", "load_ms", "fetch_ms", "wall_ms"):
                        vals = [x[step][k] for x in rows]
                        d["%s_%s" % (step, k)] = median(vals)
                        d["%s_%s_min" % (step, k)] = min(vals)
                d["remote_hits"] = all(x["remote"]["hit"] == 1 for x in rows)
                # the largest entry of the load: GET + verify + install, as the library timed it
                big = [max(x["remote"]["entries"]) for x in rows if x["remote"]["entries"]]
                if big:
                    d["entry_bytes"] = big[-1][0]
                    d["entry_ms"] = median([b[1] for b in big])
                    d["entry_ms_min"] = min(b[1] for b in big)
                res[name] = d
        finally:
            srv.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def rows(R, fms, yesno):
    """The summary rows (metric, opjit, anchor, ratio, goal, met)."""
    out = []
    rem = R.get("remote")
    if not rem:
        return out
    if "error" in rem:
        return [("remote cache: remote hit vs cold compile", "n/a", "n/a", "n/a", "-",
                 "n/a (%s)" % rem["error"][:150])]
    for name in ("nms.c", "conv2d.c", "nms.cu"):
        d = rem.get(name, {})
        if "remote_total_ms" not in d:
            out.append(("remote hit of %s" % name, "n/a", "n/a", "n/a", "-",
                        "n/a (%s)" % d.get("error", "not run")[:150]))
            continue
        sp = d["cold_total_ms"] / d["remote_total_ms"]
        goal = ">= 50x faster" if name == "nms.cu" else "report"
        met = yesno(sp >= 50) if name == "nms.cu" else "-"
        what = "NVRTC sm_90 + libtcc" if name.endswith(".cu") else "libtcc"
        out.append(("remote hit of %s (%s, %.0f KB of artifacts; opjit_create + opjit_load_file "
                    "in a fresh process, empty local cache, Redis on loopback, signed)"
                    % (name, what, d["bytes"] / 1e3),
                    fms(d["remote_total_ms"]), "cold compile: " + fms(d["cold_total_ms"]),
                    "%.0fx faster" % sp, goal, met))
        out.append(("  same, opjit_load_file alone (without opjit_create, the same on both sides) "
                    "(%s)" % name, fms(d["remote_load_ms"]),
                    "cold compile: " + fms(d["cold_load_ms"]),
                    "%.0fx faster" % (d["cold_load_ms"] / d["remote_load_ms"]), "report", "-"))
        out.append(("  of which fetching every entry it needs (%s; local hit: its checks)" % name,
                    fms(d["remote_fetch_ms"]), "local hit: " + fms(d["local_fetch_ms"]),
                    "-", "report", "-"))
        if "entry_ms" in d:
            out.append(("  its largest entry (%.0f KB): GET + HMAC + files + checks + rename, "
                        "as the library times it" % (d["entry_bytes"] / 1e3),
                        fms(d["entry_ms"]), "-", "-", "<= 2 ms per 100 KB",
                        yesno(d["entry_ms"] <= 2.0 * max(1.0, d["entry_bytes"] / 1e5))))
    return out


def md_section(R, fms):
    rem = R.get("remote")
    if not rem or "error" in rem:
        return []
    lines = ["## remote cache: remote hit vs local cold compile (fresh processes, medians (min))",
             ""]
    hdr = ["source", "artifacts", "cold compile", "compile + publish to Redis", "remote hit",
           "of which fetch", "largest entry", "local hit", "of which fetch",
           "remote hit, process wall"]
    body = []
    for name in sorted(rem):
        d = rem[name]
        if "remote_total_ms" not in d:
            body.append((name, "n/a", d.get("error", "?")[:100], "", "", "", "", "", "", ""))
            continue
        def mm(k):
            return "%s (%s)" % (fms(d.get(k)), fms(d.get(k + "_min")))
        body.append((name, "%.1f KB" % (d["bytes"] / 1e3), mm("cold_total_ms"),
                     mm("publish_total_ms"), mm("remote_total_ms"), mm("remote_fetch_ms"),
                     "%s, %.0f KB" % (mm("entry_ms"), d.get("entry_bytes", 0) / 1e3),
                     fms(d["local_total_ms"]),
                     fms(d["local_fetch_ms"]), fms(d["remote_wall_ms"])))
    lines.append("| " + " | ".join(hdr) + " |")
    lines.append("|" + "---|" * len(hdr))
    for b in body:
        lines.append("| " + " | ".join(str(c) for c in b) + " |")
    lines.append("")
    lines.append("Each step is `opjit_bench load-once` in a fresh process with an empty local cache "
                 "(OPJIT_TIERING=0): cold has the remote off; publish compiles into an empty "
                 "Redis; remote hit fetches what publish stored (signed with a fleet key, "
                 "verified, installed); local hit loads again from that process's cache. "
                 "Times are opjit_create + opjit_load_file in the process; fetch is the load "
                 "less hashing the key and dlopen + init (for a .cu: the host half, the cubin, "
                 "NVRTC's identity note and the device code's index note, each its own entry). "
                 "Largest entry: the library's own timing (debug log) of the GET, the "
                 "signature check, writing the files, their checks and the rename, for the "
                 "largest entry of the load; the first GET of a process includes connecting.")
    lines.append("")
    return lines
