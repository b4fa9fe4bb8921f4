#!/usr/bin/python3
"""bench/bench.py - opjit against its anchors, in one run (bench/run calls it).

Every figure is a ratio of opjit against its anchor measured in the same
run, on the same inputs, interleaved repetition by repetition, median
reported. The loads and the call overhead run on one thread; nms, conv2d
and mm run at 1 thread and at the machine's core count (the CPUs this
process may use), both counts side by side in the same rounds: opjit's
runtimes with cfg.num_threads, torch.set_num_threads(), OpenMP's
omp_set_num_threads() in the oneDNN anchor, openblas_set_num_threads()
for cblas_sgemm. OMP/OPENBLAS/MKL_NUM_THREADS=1 in the environment only
sets where each starts.

The C side is bench/opjit_bench (built by bench/run): `loads` times loads
in fresh processes, `serve` is a coprocess that runs opjit calls (and the
direct cblas_sgemm / direct C anchors) on request, so one repetition of
opjit and one of torch alternate. bench/dnnl_anchor (built by bench/run
where oneDNN is installed) is the conv2d anchor: oneDNN's C API, best of
plain NCHW and blocked layouts. Inputs are written once with numpy to
bench/results/inputs/*.npy and read by both sides.

Writes bench/results/latest.md, latest.json and nms.png (gnuplot).

The Python package's rows (per call from Python, loads in fresh
interpreters against load_inline) come from bench/py_bench.py.

usage: bench/bench.py --bin build/bench/opjit_bench [--dnnl build/bench/dnnl_anchor]
                      [--quick] [--reps N] [--threads 1,N]
                      [--only loads,cli,call,nms,conv2d,mm,python,lookup,remote,backward,half,torch2,inline [--merge]]
                      [--results DIR] [--torch2 PYTHON] [--isa avx2]

--isa avx2 runs the conv2d and mm sections as on a CPU with AVX2 and no
AVX-512 (every side capped at AVX2, see ISA_ENV) and keeps them beside the
native ones (conv2d_avx2, mm_avx2); with --merge the other sections stay.

The torch2 rows (opjit ops as torch 2 custom ops: the call through
torch.ops against a Python custom_op, a training step against F.conv2d,
eager and compiled) come from bench/torch2_bench.py, run by the torch 2
interpreter of the development environment (--torch2, found by bench/run)
on the package built for it.

--merge keeps the sections not named by --only from the existing
latest.json (for rerunning one section on a busy machine).
"""
import os

for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_k] = "1"

# --isa avx2: the conv2d and mm rows as on a CPU with AVX2 and no AVX-512,
# emulated on any newer one: opjit's optimizing tier built for x86-64-v3
# (OPJIT_CPU_LEVEL), oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA, the older
# DNNL_MAX_CPU_ISA), OpenBLAS on its Haswell kernels, torch's own kernels
# at AVX2 (ATEN_CPU_CAPABILITY). Set before torch is imported.
ISA_ENV = {"avx2": {"OPJIT_CPU_LEVEL": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                    "DNNL_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell",
                    "ATEN_CPU_CAPABILITY": "avx2"}}
ISA = "native"
import sys as _sys  # noqa: E402
for _i, _a in enumerate(_sys.argv):
    if _a.startswith("--isa"):
        ISA = _a.split("=", 1)[1] if "=" in _a else (_sys.argv[_i + 1:] or ["native"])[0]
os.environ.update(ISA_ENV.get(ISA, {}))
# The result keys of the conv2d and mm sections: "conv2d", or "conv2d_avx2".
ISA_SUFFIX = "" if ISA == "native" else "_" + ISA

import argparse  # noqa: E402
import resource  # noqa: E402
import datetime  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402

import backward_bench  # noqa: E402
import half_bench  # noqa: E402
import py_bench  # noqa: E402
import inline_bench  # noqa: E402
import remote_bench  # noqa: E402

torch.set_num_threads(1)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RESULTS = os.path.join(ROOT, "bench", "results")
INPUTS = os.path.join(RESULTS, "inputs")

NMS_SIZES = [500, 1000, 2000, 4000, 7000, 10000]
NMS_TABLE = [1000, 4000, 10000]
NMS_THREADED = [10000, 100000]  # at every thread count
NMS_IOU = 0.5
# ResNet-50 layer shapes: name, in channels, out channels, kernel, H=W, stride, padding
CONV_SHAPES = [
    ("3x3 64->64 @56", 64, 64, 3, 56, 1, 1),
    ("1x1 256->64 @56", 256, 64, 1, 56, 1, 0),
    ("1x1 64->256 @56", 64, 256, 1, 56, 1, 0),
    ("3x3 128->128 @28", 128, 128, 3, 28, 1, 1),
    ("1x1 512->2048 @7", 512, 2048, 1, 7, 1, 0),
]
CONV_BATCHES = [1, 8]
# Goal rows: these conv shapes (the issue's); the others are information.
CONV_GOAL_SHAPES = {"3x3 64->64 @56", "1x1 256->64 @56", "1x1 64->256 @56"}
MM_SIZES = [256, 512, 1024, 2048]
INPUT_SPEC = "v2 nms=%s conv=%s b=%s mm=%s tiny=%d,%d" % (
    NMS_SIZES + NMS_THREADED, CONV_SHAPES, CONV_BATCHES, MM_SIZES, py_bench.TINY_BOXES,
    py_bench.TINY_MM)
# 1 and the CPUs this process may run on (--threads overrides).
NCPU = len(os.sched_getaffinity(0))
THREADS = [1] if NCPU == 1 else [1, NCPU]
# --smoke: every section on tiny inputs, one repetition, a small fraction
# of the usual time per repetition, no goals (smoke_setup).
SMOKE = False
TARGET_SCALE = 1.0
# Seconds to wait after each timed repetition when several threads run:
# OpenMP (torch, oneDNN) and OpenBLAS threads spin a while after a call and
# would steal cores from the next side.
SETTLE = 0.05


T_START = time.time()


def log(msg):
    print("bench [%.0f s]: %s" % (time.time() - T_START, msg), file=sys.stderr, flush=True)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


# ---- inputs ------------------------------------------------------------------

def conv_x_name(cin, hw, b):
    return "x_c%d_h%d_b%d" % (cin, hw, b)


def conv_w_name(cout, cin, k):
    return "w_o%d_c%d_k%d" % (cout, cin, k)


def inp(name):
    return os.path.join(INPUTS, name + ".npy")


def torch_input(name):
    """The .npy file as a torch tensor in torch's own (64-byte aligned)
    memory, as the C side's npy_read gives 64-byte aligned data; np.load's
    buffers are only 16-byte aligned, which moves oneDNN's timings."""
    return torch.from_numpy(np.load(inp(name))).clone()


def gen_inputs():
    stamp = os.path.join(INPUTS, "SPEC")
    if os.path.exists(stamp) and open(stamp).read() == INPUT_SPEC:
        return
    log("generating inputs in %s" % INPUTS)
    os.makedirs(INPUTS, exist_ok=True)
    for n in NMS_SIZES + NMS_THREADED:
        # Random boxes, as the issue says: x1, y1 uniform in [0, 1000),
        # w, h uniform in [10, 110), scores uniform in [0, 1).
        rng = np.random.default_rng([1, n])
        xy = rng.uniform(0, 1000, size=(n, 2))
        wh = rng.uniform(10, 110, size=(n, 2))
        boxes = np.concatenate([xy, xy + wh], axis=1).astype(np.float32)
        scores = rng.uniform(0, 1, size=n).astype(np.float32)
        np.save(inp("boxes_%d" % n), boxes)
        np.save(inp("scores_%d" % n), scores)
    done = set()
    for (_, cin, cout, k, hw, _, _) in CONV_SHAPES:
        for b in CONV_BATCHES:
            xn = conv_x_name(cin, hw, b)
            if xn not in done:
                rng = np.random.default_rng([2, cin, hw, b])
                np.save(inp(xn), rng.standard_normal((b, cin, hw, hw), dtype=np.float32))
                done.add(xn)
        wn = conv_w_name(cout, cin, k)
        if wn not in done:
            rng = np.random.default_rng([3, cout, cin, k])
            w = rng.standard_normal((cout, cin, k, k), dtype=np.float32)
            np.save(inp(wn), (w * np.float32(math.sqrt(2.0 / (cin * k * k)))).astype(np.float32))
            done.add(wn)
    for n in MM_SIZES:
        rng = np.random.default_rng([4, n])
        np.save(inp("mm_a_%d" % n), rng.standard_normal((n, n), dtype=np.float32))
        np.save(inp("mm_b_%d" % n), rng.standard_normal((n, n), dtype=np.float32))
    py_bench.gen_tiny_inputs(inp)
    with open(stamp, "w") as f:
        f.write(INPUT_SPEC)


# ---- the C coprocess ---------------------------------------------------------

class BenchError(Exception):
    pass


class Serve:
    """A coprocess answering one command per line (opjit_bench serve, or
    dnnl_anchor serve)."""
    def __init__(self, exe, cache=None):
        env = dict(os.environ, OPJIT_BENCH_THREADS=",".join(map(str, THREADS)))
        if cache:
            env["OPJIT_BENCH_CACHE"] = cache
        self.exe = os.path.basename(exe)
        self.p = subprocess.Popen([exe, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, bufsize=1, env=env, cwd=ROOT)

    def cmd(self, *words):
        self.p.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise BenchError("%s serve died (command: %s)" % (self.exe, " ".join(map(str, words))))
        line = line.rstrip("\n")
        if line.startswith("err"):
            raise BenchError(line[4:])
        out = {}
        for tok in line.split()[1:]:
            if "=" in tok:
                k, v = tok.split("=", 1)
                out[k] = v
        return out

    def close(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
            self.p.wait(timeout=60)
        except Exception:
            self.p.kill()


# ---- timing ------------------------------------------------------------------

def calibrate(fn, target):
    """Iterations per repetition so that one repetition lasts about target s.
    fn(iters) returns (wall s, thread CPU s, page faults per call) of iters
    calls. The first call warms up."""
    fn(1)
    iters = 1
    while True:
        t = fn(iters)[0]
        if t >= 0.02 or iters >= 10_000_000:
            break
        iters = min(10_000_000, iters * max(2, int(0.03 / max(t, 1e-9))))
    return max(1, int(round(target / (t / iters))))


def interleaved(sides, reps, target, settle=0.0):
    """sides: [(name, fn)]. Calibrate each, then `reps` rounds, each timing
    one repetition of every side (the order rotates from round to round),
    sleeping `settle` s after each. Returns {name: {"wall": [s per call, one
    per round], "cpu": [...], "flt": [...]}} and {name: iters per
    repetition}."""
    target *= TARGET_SCALE
    iters = {name: calibrate(fn, target) for name, fn in sides}
    out = {name: {"wall": [], "cpu": [], "flt": []} for name, _ in sides}
    for r in range(reps):
        k = r % len(sides)
        for name, fn in sides[k:] + sides[:k]:
            w, c, f = fn(iters[name])
            out[name]["wall"].append(w / iters[name])
            out[name]["cpu"].append(c / iters[name])
            out[name]["flt"].append(f)
            if settle:
                time.sleep(settle)
    return out, iters


def round_ratio(t, num, den, kind="wall"):
    """Median over rounds of num's time / den's time in the same round: drift
    and bursts of load on the shared machine hit both sides of a round."""
    return median([a / b for a, b in zip(t[num][kind], t[den][kind])])


def summarize(t, row):
    for k, v in t.items():
        row[k + "_ms"] = median(v["wall"]) * 1e3
        row[k + "_cpu_ms"] = median(v["cpu"]) * 1e3
        row[k + "_flt"] = median(v["flt"])
        row[k + "_ms_all"] = [x * 1e3 for x in v["wall"]]
        row[k + "_cpu_ms_all"] = [x * 1e3 for x in v["cpu"]]


def minflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def torch_timer(call, threads=1):
    """torch in this process on `threads` threads; CPU time is this thread's
    (all of the work at one thread)."""
    def fn(iters):
        torch.set_num_threads(threads)
        f0 = minflt()
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(iters):
            call()
        t1, c1 = time.perf_counter(), time.thread_time()
        return t1 - t0, c1 - c0, (minflt() - f0) / iters
    return fn


def opjit_timer(sv, *words):
    def fn(iters):
        o = sv.cmd(*words, iters)
        return float(o["sec"]), float(o["cpu"]), float(o.get("flt", "nan"))
    return fn


def dnnl_timer(dn, facts, key, *words):
    """The oneDNN anchor; facts[key] gets its implementation and layout."""
    def fn(iters):
        o = dn.cmd(*words, iters)
        facts[key] = (o.get("impl", "?"), o.get("layout", "?"))
        return float(o["sec"]), float(o["cpu"]), float(o.get("flt", "nan"))
    return fn


# ---- loads in fresh processes ------------------------------------------------

def parse_rep(line, skip=2):
    """The k=v fields of a line, after its first skip words."""
    d = {}
    for tok in line.split()[skip:]:
        k, v = tok.split("=", 1)
        try:
            d[k] = float(v)
        except ValueError:
            d[k] = v
    return d


def run_loads(exe, src, reps, with_cc, extra_env=None):
    env = dict(os.environ)
    env.update(extra_env or {})
    args = [exe, "loads", src, str(reps + 1)] + ([] if with_cc else ["nocc"])
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise BenchError("opjit_bench loads %s failed: %s" % (src, p.stderr.strip()))
    rows = [parse_rep(l) for l in p.stdout.splitlines() if l.startswith("rep ")]
    rows = rows[1:]  # the first repetition warms the page cache: dropped
    errs = sorted({str(v) for r in rows for k, v in r.items() if k.endswith("_err")})
    res = {"reps": len(rows), "raw": rows}
    for key in ("cold_ms", "cold_wall_ms", "hit_ms", "hit_wall_ms", "cc_ms", "cc_compile_ms",
                "dlopen_ms", "dlopen_wall_ms", "tccbare_ms", "tccbare_wall_ms", "opthit_ms",
                "opthit_wall_ms", "hitdl_ms", "hitdl_wall_ms", "hitfloor_ms", "hitfloor_wall_ms",
                "cold_create_ms", "cold_key_ms", "cold_compile_ms", "cold_dlopen_init_ms",
                "hit_create_ms", "hit_key_ms", "hit_dlopen_init_ms"):
        vals = [r[key] for r in rows if isinstance(r.get(key), float)]
        if vals:
            res[key] = median(vals)
            res[key + "_all"] = vals
    both = [(r["cc_ms"], r["cold_ms"]) for r in rows
            if isinstance(r.get("cc_ms"), float) and isinstance(r.get("cold_ms"), float)]
    if both:
        res["cc_over_cold"] = median([a / b for a, b in both])
    # The hit against a dlopen + dlsym of the artifact it loaded, per repetition.
    hd = [(r["hit_ms"], r["hitdl_ms"]) for r in rows
          if isinstance(r.get("hit_ms"), float) and isinstance(r.get("hitdl_ms"), float)]
    if hd:
        res["hit_over_dl"] = median([a / b for a, b in hd])
    fd = [(r["hitfloor_ms"], r["hitdl_ms"]) for r in rows
          if isinstance(r.get("hitfloor_ms"), float) and isinstance(r.get("hitdl_ms"), float)]
    if fd:
        res["floor_over_dl"] = median([a / b for a, b in fd])
    for key in ("cold_tier", "hit_tier", "opthit_tier"):
        vals = sorted({r[key] for r in rows if key in r})
        if vals:
            res[key] = ",".join(vals)
    if errs:
        res["errors"] = [e.replace("_", " ") for e in errs]
    return res


# ---- the benchmarks ----------------------------------------------------------

FULL_CACHE_ENTRIES = 3000


def bench_full_cache_section(exe, reps):
    n = 100 if SMOKE else FULL_CACHE_ENTRIES
    log("loads: nms.c into a cache of %d entries (%d reps, fresh processes)" % (n, reps))
    try:
        return bench_full_cache(exe, reps, n)
    except (BenchError, OSError, subprocess.SubprocessError) as e:
        return {"error": str(e)[:200]}


def bench_full_cache(exe, reps, n):
    """Cold loads of nms.c into a cache already holding n entries (copies of
    nms.c's own under other keys, their files hard links: the same sizes to
    count without writing them): a build must not cost more for the entries
    around it. Each repetition removes nms.c's entry first. The
    first load, untimed apart, finds no usage ledger and walks the cache
    (what a build does every 256 installs)."""
    d = tempfile.mkdtemp(prefix="opjit-full-cache-")
    env = dict(os.environ, OPJIT_CACHE_DIR=d, OPJIT_TIERING="0")

    def once():
        p = subprocess.run([exe, "load-once", "ops-src/nms.c"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
        line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
        if p.returncode != 0 or not line.startswith("ok "):
            raise BenchError("load-once into the full cache: %s %s" % (line, p.stderr.strip()[:200]))
        r = parse_rep(line, 1)
        if r.get("hit") != 0.0:
            raise BenchError("load-once into the full cache was not a build")
        return r["total_ms"]

    try:
        once()
        entries = glob.glob(os.path.join(d, "v1", "entries", "*", "*"))
        if len(entries) != 1:
            raise BenchError("expected one entry, found %d" % len(entries))
        own = entries[0]
        rnd = np.random.default_rng(1)
        for _ in range(n - 1):
            key = "".join("%02x" % b for b in rnd.integers(0, 256, 16))
            shard = os.path.join(d, "v1", "entries", key[:2])
            os.makedirs(shard, mode=0o700, exist_ok=True)
            shutil.copytree(own, os.path.join(shard, key), copy_function=os.link)
        size = sum(os.path.getsize(os.path.join(r, f))
                   for r, _, fs in os.walk(os.path.join(d, "v1", "entries")) for f in fs)
        # The directories just made go to disk now, not during the timed loads.
        os.sync()
        usage = os.path.join(d, "v1", "usage")
        if os.path.exists(usage):
            os.unlink(usage)
        shutil.rmtree(own)
        walk = once()
        times = []
        for _ in range(reps):
            shutil.rmtree(own)
            times.append(once())
        return {"entries": n, "bytes": size, "walk_ms": walk, "cold_ms": median(times),
                "cold_ms_all": times}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def bench_loads(exe, reps):
    out = {}
    srcs = sorted(glob.glob(os.path.join(ROOT, "ops-src", "*.c")))
    cus = sorted(glob.glob(os.path.join(ROOT, "ops-src", "*.cu")))
    # A small op with <math.h>, as op authors write them (not shipped).
    srcs.append(os.path.join(ROOT, "bench", "ops", "exp_scale.c"))
    if SMOKE:  # the sources of the goal rows: every other one is a report row
        srcs = [s for s in srcs if os.path.basename(s) in ("nms.c", "exp_scale.c")]
        cus = [s for s in cus if os.path.basename(s) == "nms.cu"]
    for s in srcs:
        rel = os.path.relpath(s, ROOT)
        log("loads: %s (%d reps, fresh processes)" % (rel, reps))
        try:
            out[os.path.basename(s)] = run_loads(exe, rel, reps, True)
        except BenchError as e:
            out[os.path.basename(s)] = {"errors": [str(e)]}
    for s in cus:
        rel = os.path.relpath(s, ROOT)
        log("loads: %s (%d reps, OPJIT_CUDA_ARCHS=sm_90)" % (rel, reps))
        try:
            out[os.path.basename(s)] = run_loads(exe, rel, reps, False,
                                                 {"OPJIT_CUDA_ARCHS": "sm_90"})
        except BenchError as e:
            out[os.path.basename(s)] = {"errors": [str(e)]}
    return out


def load_op(sv, name):
    src = os.path.join("ops-src", name + ".c")
    if not os.path.exists(os.path.join(ROOT, src)):
        return None, "n/a (op missing)"
    try:
        r = sv.cmd("load", name, src)
    except BenchError as e:
        return None, "n/a (load failed: %s)" % str(e)[:200]
    if r.get("opt") != "opt":
        log("%s: optimizing tier did not take over (opt runtime serves %s)" % (name, r.get("opt")))
    return r, None


def bench_call_overhead(sv, reps):
    log("call overhead")
    res = {"tiers": sv.cmd("load", "add1", "bench/ops/add1.c")}
    sides = [("opjit_opt", opjit_timer(sv, "add1", "opt")),
             ("opjit_tcc", opjit_timer(sv, "add1", "tcc")),
             ("direct", opjit_timer(sv, "direct"))]
    # Cheap rounds (0.1 s each): more of them, as the difference is small.
    t, iters = interleaved(sides, max(15, 2 * reps), 0.1)
    res["iters"] = iters
    for k, v in t.items():
        res[k + "_ns"] = median(v["wall"]) * 1e9
        res[k + "_cpu_ns"] = median(v["cpu"]) * 1e9
        res[k + "_ns_all"] = [x * 1e9 for x in v["wall"]]
    # The difference within each round, then the median.
    for tier in ("opt", "tcc"):
        for kind, suf in (("wall", ""), ("cpu", "_cpu")):
            res["overhead%s_%s_ns" % (suf, tier)] = median(
                [(a - b) * 1e9 for a, b in zip(t["opjit_" + tier][kind], t["direct"][kind])])
    return res


def nms_sum(keep):
    k = keep.numpy().astype(np.int64)
    return int(len(k)), int(np.sum(k * np.arange(1, len(k) + 1, dtype=np.int64)))


def bench_nms(sv, reps):
    r, missing = load_op(sv, "nms")
    if missing:
        return {"missing": missing}
    res = {"tiers": r, "sizes": {}, "threaded": {}}
    for n in NMS_SIZES + NMS_THREADED:
        bn, sn = "boxes_%d" % n, "scores_%d" % n
        sv.cmd("input", bn, inp(bn))
        sv.cmd("input", sn, inp(sn))
        boxes = torch_input(bn)
        scores = torch_input(sn)
        ref = nms_sum(torchvision.ops.nms(boxes, scores, NMS_IOU))
        facts = {}

        def opjit_side(tier):
            def fn(it):
                o = sv.cmd("nms", tier, bn, sn, NMS_IOU, it)
                facts[tier] = (int(o["kept"]), int(o["sum"]))
                return float(o["sec"]), float(o["cpu"]), float(o["flt"])
            return fn

        def tv():
            torchvision.ops.nms(boxes, scores, NMS_IOU)

        if n in NMS_SIZES:  # the sweep: one thread, both tiers
            log("nms n=%d" % n)
            sides = [("tcc", opjit_side("tcc@1")), ("opt", opjit_side("opt@1")),
                     ("torchvision", torch_timer(tv))]
            t, iters = interleaved(sides, reps, 0.15)
            row = {"kept": ref[0], "match_tcc": facts.get("tcc@1") == ref,
                   "match_opt": facts.get("opt@1") == ref, "iters": iters}
            summarize(t, row)
            for tier in ("tcc", "opt"):
                row["ratio_" + tier] = round_ratio(t, tier, "torchvision")
                row["ratio_cpu_" + tier] = round_ratio(t, tier, "torchvision", "cpu")
            res["sizes"][n] = row
        if n in NMS_THREADED:  # every thread count, side by side
            log("nms n=%d at %s threads" % (n, THREADS))
            sides = []
            for T in THREADS:
                sides += [("opt@%d" % T, opjit_side("opt@%d" % T)),
                          ("torchvision@%d" % T, torch_timer(tv, T))]
            t, iters = interleaved(sides, reps if n <= 10000 else max(3, reps // 2), 0.15,
                                   SETTLE if len(THREADS) > 1 else 0)
            row = {"kept": ref[0], "iters": iters,
                   "match": all(facts.get("opt@%d" % T) == ref for T in THREADS)}
            summarize(t, row)
            for T in THREADS:
                row["ratio@%d" % T] = round_ratio(t, "opt@%d" % T, "torchvision@%d" % T)
            if len(THREADS) > 1:
                row["speedup"] = round_ratio(t, "opt@1", "opt@%d" % THREADS[-1])
            res["threaded"][n] = row
    return res


def conv_sides(sv, dn, facts, xn, wn, stride, pad, x, w):
    """Every side of one convolution, at every thread count."""
    def tconv():
        with torch.no_grad():
            F.conv2d(x, w, None, stride, pad)
    sides = []
    for T in THREADS:
        sides += [("opt@%d" % T, opjit_timer(sv, "conv", "opt@%d" % T, xn, wn, stride, pad)),
                  ("tcc@%d" % T, opjit_timer(sv, "conv", "tcc@%d" % T, xn, wn, stride, pad)),
                  ("torch@%d" % T, torch_timer(tconv, T))]
        if dn:
            sides.append(("onednn@%d" % T, dnnl_timer(dn, facts, T, "conv", inp(xn), inp(wn),
                                                      stride, pad, T)))
    return sides


def bench_conv(sv, dn, reps, tmp):
    r, missing = load_op(sv, "conv2d")
    if missing:
        return {"missing": missing}
    res = {"tiers": r, "shapes": [], "onednn": bool(dn)}
    for (name, cin, cout, k, hw, stride, pad) in CONV_SHAPES:
        wn = conv_w_name(cout, cin, k)
        sv.cmd("input", wn, inp(wn))
        w = torch_input(wn)
        for b in CONV_BATCHES:
            label = "%s, batch %d" % (name, b)
            log("conv2d %s at %s threads" % (label, THREADS))
            xn = conv_x_name(cin, hw, b)
            sv.cmd("input", xn, inp(xn))
            x = torch_input(xn)
            row = {"name": name, "batch": b, "label": label, "goal": name in CONV_GOAL_SHAPES,
                   "flops": 2.0 * b * cout * cin * k * k * ((hw + 2 * pad - k) // stride + 1) ** 2}
            try:
                outp = os.path.join(tmp, "conv_out.npy")
                sv.cmd("conv", "opt@%d" % THREADS[-1], xn, wn, stride, pad, 1, outp)
                with torch.no_grad():
                    ref = F.conv2d(x, w, None, stride, pad).numpy()
                got = np.load(outp)
                if got.shape != ref.shape:
                    raise BenchError("output shape %s, torch's %s" % (got.shape, ref.shape))
                row["max_rel_err"] = float(np.max(np.abs(got - ref)) / max(1e-30, np.max(np.abs(ref))))
                facts = {}
                sides = conv_sides(sv, dn, facts, xn, wn, stride, pad, x, w)
                big = row["flops"] > 1e9
                t, iters = interleaved(sides, max(5, reps - 2) if big else reps, 0.15,
                                       SETTLE if len(THREADS) > 1 else 0)
                row["iters"] = iters
                summarize(t, row)
                for T in THREADS:
                    for tier in ("opt", "tcc"):
                        row["ratio_%s_torch@%d" % (tier, T)] = round_ratio(
                            t, "torch@%d" % T, "%s@%d" % (tier, T))
                    if dn:
                        row["ratio_opt_onednn@%d" % T] = round_ratio(t, "onednn@%d" % T,
                                                                     "opt@%d" % T)
                        row["onednn_impl@%d" % T], row["onednn_layout@%d" % T] = facts[T]
                if len(THREADS) > 1:
                    N = THREADS[-1]
                    for side in ("opt", "tcc", "torch") + (("onednn",) if dn else ()):
                        row["speedup_" + side] = round_ratio(t, "%s@1" % side, "%s@%d" % (side, N))
            except BenchError as e:
                row["error"] = str(e)[:300]
            res["shapes"].append(row)
    return res


def bench_mm(sv, dn, reps, tmp):
    r, missing = load_op(sv, "mm")
    if missing:
        return {"missing": missing}
    res = {"tiers": r, "sizes": {}}
    for n in MM_SIZES:
        log("mm %d at %s threads" % (n, THREADS))
        an, bn = "mm_a_%d" % n, "mm_b_%d" % n
        sv.cmd("input", an, inp(an))
        sv.cmd("input", bn, inp(bn))
        row = {}
        try:
            outp = os.path.join(tmp, "mm_out.npy")
            sv.cmd("mm", "opt@%d" % THREADS[-1], an, bn, 1, outp)
            a64 = np.load(inp(an)).astype(np.float64)
            ref = a64 @ np.load(inp(bn)).astype(np.float64)
            row["max_rel_err"] = float(np.max(np.abs(np.load(outp) - ref)) / np.max(np.abs(ref)))
            sides = []
            facts = {}
            for T in THREADS:
                sides += [("opt@%d" % T, opjit_timer(sv, "mm", "opt@%d" % T, an, bn)),
                          ("sgemm@%d" % T, opjit_timer(sv, "sgemm", an, bn, T)),
                          ("tcc@%d" % T, opjit_timer(sv, "mm", "tcc@%d" % T, an, bn))]
                if dn:  # oneDNN's sgemm, preallocated C as cblas_sgemm's
                    sides.append(("dnnl_sgemm@%d" % T, dnnl_timer(dn, facts, T, "sgemm", inp(an),
                                                                  inp(bn), T)))
            t, iters = interleaved(sides, max(5, reps - 2) if n >= 2048 else reps, 0.15,
                                   SETTLE if len(THREADS) > 1 else 0)
            row["iters"] = iters
            summarize(t, row)
            for T in THREADS:
                for tier in ("opt", "tcc"):
                    row["ratio_%s@%d" % (tier, T)] = round_ratio(t, "sgemm@%d" % T,
                                                                 "%s@%d" % (tier, T))
                if dn:  # against the faster BLAS of the two, per round
                    best = [min(a, b) for a, b in zip(t["sgemm@%d" % T]["wall"],
                                                      t["dnnl_sgemm@%d" % T]["wall"])]
                    row["ratio_opt_best@%d" % T] = round_ratio(
                        dict(t, best={"wall": best}), "best", "opt@%d" % T)
                    row["dnnl_impl@%d" % T] = facts[T][0]
            if len(THREADS) > 1:
                for side in ("opt", "sgemm", "tcc"):
                    row["speedup_" + side] = round_ratio(t, "%s@1" % side,
                                                         "%s@%d" % (side, THREADS[-1]))
        except BenchError as e:
            row["error"] = str(e)[:300]
        res["sizes"][n] = row
    return res


def bench_hosts(sv, reps):
    """Several host threads calling conv2d at once on one runtime: what the
    policy (one loop on the pool at a time, the others inline on their own
    thread) gives, against one host thread using the whole pool and against
    host threads on a runtime of one thread."""
    if len(THREADS) < 2:
        return {}
    N = THREADS[-1]
    name, cin, cout, k, hw, stride, pad = CONV_SHAPES[0]
    xn, wn = conv_x_name(cin, hw, 1), conv_w_name(cout, cin, k)
    sv.cmd("input", xn, inp(xn))
    sv.cmd("input", wn, inp(wn))
    log("conv2d %s, batch 1, from %d host threads at once" % (name, N))

    def hosts(tier, nh):
        def fn(iters):
            o = sv.cmd("hosts", tier, nh, xn, wn, stride, pad, iters)
            return float(o["sec"]) / nh, float(o["cpu"]) / nh, 0.0
        return fn
    sides = [("1 host thread, pool of %d" % N, hosts("opt@%d" % N, 1)),
             ("%d host threads, pool of %d" % (N, N), hosts("opt@%d" % N, N)),
             ("%d host threads, pool of 1" % N, hosts("opt@1", N))]
    t, iters = interleaved(sides, reps, 0.3, SETTLE)
    row = {"shape": "%s, batch 1" % name, "iters": iters, "sides": [n for n, _ in sides]}
    summarize(t, row)
    return row


def bench_faults(sv):
    """What a fresh page costs here, against rewriting one."""
    try:
        o = sv.cmd("faultcost")
        return {"fresh_us": float(o["fresh_us"]), "again_us": float(o["again_us"]),
                "reuse_us": float(o["reuse_us"])}
    except BenchError as e:
        return {"error": str(e)[:200]}


def nvrtc_available():
    cands = glob.glob("/usr/local/cuda/lib64/libnvrtc.so*") + glob.glob("/usr/local/cuda/lib/libnvrtc.so*")
    if cands:
        return True
    import ctypes.util
    return ctypes.util.find_library("nvrtc") is not None


def gpu_present():
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


# ---- report ------------------------------------------------------------------

def fms(x):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if x >= 100:
        return "%.0f ms" % x
    if x >= 10:
        return "%.1f ms" % x
    if x >= 1:
        return "%.2f ms" % x
    return "%.3f ms" % x


def yesno(b):
    return "yes" if b else "**no**"


def thr(T):
    return "1 thread" if T == 1 else "%d threads" % T


def hit_rows(R, name):
    """The cache hit of one source in a fresh process against dlopen + dlsym
    of the very artifact it loaded (its host.so), in another."""
    L = R["loads"]
    l = L.get(name)
    metric = ("cache-hit load of %s in a fresh process (opjit_create + opjit_load_file, "
              "in-process%s)" % (name, "; sm_90 device code" if name.endswith(".cu") else ""))
    if l is None:
        if name.endswith(".cu") and not R["nvrtc"]:
            return [(metric, "n/a: NVRTC not available", "-", "-", "<= 3x time", "-")]
        return [(metric, "n/a", "n/a", "n/a", "<= 3x time", "not run" if not R["ran_loads"]
                 else "n/a (%s missing)" % name)]
    if "hit_ms" not in l or "hit_over_dl" not in l:
        return [(metric, "n/a", "n/a", "n/a", "<= 3x time",
                 "n/a (%s)" % "; ".join(l.get("errors", ["no dlopen of its artifact"]))[:200])]
    r = l["hit_over_dl"]
    floor = []
    if "floor_over_dl" in l:
        # What any correct hit costs: opjit's own share is the rest.
        what = ("the manifests and artifacts of its host code and its device code (the cubin)"
                if name.endswith(".cu") else "the manifest and the artifact")
        floor = [("  the floor: reading and hashing %s and its headers, %s, each checked against "
                  "its manifest, then dlopen + dlsym (no runtime, trust checks, lock, compiler "
                  "identity or registration), fresh process; opjit adds %s"
                  % (name, what, fms(l["hit_ms"] - l["hitfloor_ms"])), fms(l["hitfloor_ms"]),
                  "dlopen + dlsym of the same artifact: " + fms(l["hitdl_ms"]),
                  "%.1fx time" % l["floor_over_dl"], "report", "-")]
    return [(metric, fms(l["hit_ms"]),
             "dlopen + dlsym of the same artifact (its host.so), fresh process: "
             + fms(l["hitdl_ms"]), "%.1fx time" % r, "<= 3x time", yesno(r <= 3.0))] + floor + [
            ("  same, whole process wall time (spawn to exit; information)",
             fms(l.get("hit_wall_ms")), "process doing only that dlopen: "
             + fms(l.get("hitdl_wall_ms")),
             "%.2fx time" % (l["hit_wall_ms"] / l["hitdl_wall_ms"])
             if l.get("hitdl_wall_ms") and l.get("hit_wall_ms") else "n/a", "report", "-")]


# The conv2d and mm rows of one instruction set ("" native, "_avx2").
ISA_TAG = {"": "", "_avx2": " [AVX2, emulated]"}


def conv_rows(C, tag):
    rows = []
    if "missing" in C:
        rows.append(("conv2d CPU, ResNet-50 shapes" + tag, "n/a", "n/a", "n/a", ">= 1.0x oneDNN", C["missing"]))
    elif C and not C.get("onednn"):
        rows.append(("conv2d CPU against oneDNN" + tag, "n/a", "n/a", "n/a", ">= 1.0x oneDNN",
                     "n/a (oneDNN not found: install libdnnl-dev)"))
    for s in C.get("shapes", []):
        if not s.get("goal"):
            continue
        for T in THREADS:
            metric = "conv2d CPU %s, %s (opt tier)%s" % (s["label"], thr(T), tag)
            if "error" in s:
                rows.append((metric, "n/a", "n/a", "n/a", ">= 1.0x oneDNN", "n/a (%s)" % s["error"][:120]))
                break
            if "ratio_opt_onednn@%d" % T not in s:
                continue
            r = s["ratio_opt_onednn@%d" % T]
            rows.append((metric, fms(s["opt@%d_ms" % T]),
                         "oneDNN %s (%s): %s" % (s["onednn_impl@%d" % T], s["onednn_layout@%d" % T],
                                                 fms(s["onednn@%d_ms" % T])),
                         "%.2fx throughput" % r, ">= 1.0x throughput", yesno(r >= 1.0)))
    if len(THREADS) > 1:
        for s in C.get("shapes", []):
            if s.get("goal") and s["batch"] == 8 and "speedup_opt" in s:
                sp = s["speedup_opt"]
                anchor = "oneDNN %.2fx, torch %.2fx" % (s.get("speedup_onednn", float("nan")),
                                                       s["speedup_torch"])
                goal = ">= 1.8x" if THREADS[-1] == 2 else "report"
                rows.append(("conv2d %s speedup, %s (opt tier)%s" % (thr(THREADS[-1]), s["label"], tag),
                             "%.2fx" % sp, anchor, "-", goal,
                             yesno(sp >= 1.8) if THREADS[-1] == 2 else "-"))
    return rows


def mm_rows(M, tag):
    rows = []
    if "missing" in M:
        rows.append(("mm CPU 256-2048" + tag, "n/a", "n/a", "n/a", ">= 0.97x", M["missing"]))
    for n, s in M.get("sizes", {}).items():
        for T in THREADS:
            metric = "mm CPU %dx%d float32, %s (opt tier)%s" % (n, n, thr(T), tag)
            if "error" in s:
                rows.append((metric, "n/a", "n/a", "n/a", ">= 0.97x throughput", "n/a (%s)" % s["error"][:120]))
                break
            if "ratio_opt_best@%d" % T in s:  # the faster of cblas_sgemm and dnnl_sgemm
                r = s["ratio_opt_best@%d" % T]
                rows.append((metric, fms(s["opt@%d_ms" % T]),
                             "cblas_sgemm %s, oneDNN %s %s, %s" % (
                                 fms(s["sgemm@%d_ms" % T]), s["dnnl_impl@%d" % T],
                                 fms(s["dnnl_sgemm@%d_ms" % T]), thr(T)),
                             "%.3fx throughput" % r, ">= 1.0x the faster", yesno(r >= 1.0)))
                continue
            r = s["ratio_opt@%d" % T]
            rows.append((metric, fms(s["opt@%d_ms" % T]),
                         "cblas_sgemm, %s: %s" % (thr(T), fms(s["sgemm@%d_ms" % T])),
                         "%.3fx throughput" % r, ">= 0.97x throughput", yesno(r >= 0.97)))
    return rows


def build_rows(R):
    rows = []  # (metric, opjit, anchor, ratio, goal, met)
    L = R["loads"]
    nms = L.get("nms.c", {})
    if "cold_ms" in nms and "cc_ms" in nms:
        sp = nms["cc_over_cold"]
        rows.append(("cold load of nms.c: opjit_create + opjit_load_file, libtcc, fresh process and empty cache",
                     fms(nms["cold_ms"]), "cc -O2 -shared + dlopen + dlsym: " + fms(nms["cc_ms"]),
                     "%.1fx faster" % sp, ">= 80x faster", yesno(sp >= 80)))
    else:
        rows.append(("cold load of nms.c", "n/a", "n/a", "n/a", ">= 80x faster",
                     "n/a (%s)" % "; ".join(nms.get("errors", ["nms.c missing" if R["ran_loads"] else "not run"]))[:200]))
    fc = R.get("full_cache", {})
    if "cold_ms" in fc and "cold_ms" in nms:
        r = fc["cold_ms"] / nms["cold_ms"]
        rows.append(("  the same into a cache of %d entries (%.0f MB): the build counts its entry in "
                     "the cache's usage ledger; the walk of every entry that keeps the cap, done "
                     "when the ledger is new or every 256 installs, took %s"
                     % (fc["entries"], fc["bytes"] / 1e6, fms(fc["walk_ms"])),
                     fms(fc["cold_ms"]), "into an empty cache: " + fms(nms["cold_ms"]),
                     "%.2fx time" % r, "<= 1.2x time", yesno(r <= 1.2)))
    elif R["ran_loads"]:
        rows.append(("  nms.c into a full cache", "n/a", "n/a", "n/a", "<= 1.2x time",
                     "n/a (%s)" % fc.get("error", "not run")))
    if "tccbare_ms" in nms and "cc_ms" in nms:
        # What any load through libtcc costs: opjit's own share is the rest.
        adds = ("; opjit adds " + fms(nms["cold_ms"] - nms["tccbare_ms"])) if "cold_ms" in nms else ""
        rows.append(("  libtcc alone compiles nms.c, its headers read and preprocessed (opjit "
                     "starts from <opjit_op.h> preprocessed at build time), and dlopens it (no "
                     "cache, key or checks), fresh process" + adds,
                     fms(nms["tccbare_ms"]), "cc -O2 -shared + dlopen + dlsym: " + fms(nms["cc_ms"]),
                     "%.1fx faster" % (nms["cc_ms"] / nms["tccbare_ms"]), "report", "-"))
    ex = L.get("exp_scale.c", {})
    if "cold_ms" in ex and "cc_ms" in ex and "tccbare_ms" in ex:
        rows.append(("cold load of a small op with <math.h> (bench/ops/exp_scale.c), fresh process "
                     "and empty cache; beside it libtcc alone on the plain source: "
                     + fms(ex["tccbare_ms"]), fms(ex["cold_ms"]),
                     "cc -O2 -shared + dlopen + dlsym: " + fms(ex["cc_ms"]),
                     "%.1fx faster" % ex["cc_over_cold"], "report", "-"))
    elif ex:
        rows.append(("cold load of a small op with <math.h> (bench/ops/exp_scale.c)", "n/a", "n/a",
                     "n/a", "report", "n/a (%s)" % "; ".join(ex.get("errors", ["?"]))[:200]))
    for name in ("nms.c", "nms.cu"):
        rows += hit_rows(R, name)
    if "opthit_ms" in nms:
        rows.append(("  nms.c, the cache holding the optimized (cc -O2) artifact: tier %s" % nms.get("opthit_tier", "?"),
                     fms(nms["opthit_ms"]), "dlopen + dlsym of the cc-built .so: " + fms(nms.get("dlopen_ms")),
                     "%.1fx time" % (nms["opthit_ms"] / nms["dlopen_ms"]) if nms.get("dlopen_ms") else "n/a",
                     "report", "-"))
    rows += cli_rows(R)
    rows += lookup_rows(R)
    co = R.get("call_overhead", {})
    if "overhead_opt_ns" in co:
        rows.append(("opjit_call overhead over a direct C call, trivial op (add1 on 1 float, opt tier)",
                     "%.0f ns/call" % co["opjit_opt_ns"], "direct C: %.0f ns/call" % co["direct_ns"],
                     "+%.0f ns" % co["overhead_opt_ns"], "<= 50 ns", yesno(co["overhead_opt_ns"] <= 50)))
    else:
        rows.append(("opjit_call overhead", "n/a", "n/a", "n/a", "<= 50 ns", "n/a (%s)" % co.get("error", "?")))
    N = R.get("nms", {})
    for n in NMS_TABLE:
        for tier in ("tcc", "opt"):
            metric = "nms CPU, %d random boxes, IoU 0.5, %s tier" % (n, tier)
            s = N.get("sizes", {}).get(n)
            if not s:
                rows.append((metric, "n/a", "n/a", "n/a", "<= 0.8x time", N.get("missing", "n/a")))
                continue
            ratio = s["ratio_" + tier]
            ok = s["match_" + tier]
            goal = "<= 0.8x time" + ("" if tier == "opt" else " (the opt tier must meet it)")
            rows.append((metric, fms(s[tier + "_ms"]), "torchvision.ops.nms: " + fms(s["torchvision_ms"]),
                         "%.2fx time" % ratio, goal,
                         yesno(ratio <= 0.8) + ("" if ok else " (RESULT DIFFERS)")))
    for n, s in sorted(N.get("threaded", {}).items()):
        for T in THREADS:
            if "opt@%d_ms" % T not in s:
                continue
            ratio = s["ratio@%d" % T]
            rows.append(("nms CPU, %d random boxes, IoU 0.5, %s (opt tier)" % (n, thr(T)),
                         fms(s["opt@%d_ms" % T]),
                         "torchvision.ops.nms, %s: %s" % (thr(T), fms(s["torchvision@%d_ms" % T])),
                         "%.2fx time" % ratio, "<= 0.8x time",
                         yesno(ratio <= 0.8) + ("" if s["match"] else " (RESULT DIFFERS)")))
    for suf in ("", "_avx2"):
        if suf == "" or "conv2d" + suf in R:
            rows += conv_rows(R.get("conv2d" + suf, {}), ISA_TAG[suf])
        if suf == "" or "mm" + suf in R:
            rows += mm_rows(R.get("mm" + suf, {}), ISA_TAG[suf])
    rows.extend(backward_bench.rows(R.get("backward"), fms, yesno, thr))
    rows.extend(half_bench.rows(R.get("half"), fms, yesno, thr))
    cu = L.get("nms.cu")
    if cu is None or not R["nvrtc"]:
        why = ("not run" if not R["ran_loads"] else "n/a: ops-src/nms.cu missing") if cu is None \
            else "n/a: NVRTC not available"
        rows.append(("NVRTC cold compile of nms.cu to an sm_90 cubin (fresh process, empty cache)", why, "-", "-", "report", "-"))
        rows.append(("NVRTC cache hit of nms.cu (fresh process)", why, "-", "-", "<= 2 ms", "-"))
    elif "cold_ms" not in cu:
        why = "n/a (load failed: %s)" % "; ".join(cu.get("errors", ["?"]))[:200]
        rows.append(("NVRTC cold compile of nms.cu to an sm_90 cubin (fresh process, empty cache)", why, "-", "-", "report", "-"))
        rows.append(("NVRTC cache hit of nms.cu (fresh process)", why, "-", "-", "<= 2 ms", "-"))
    else:
        rows.append(("NVRTC cold compile of nms.cu to an sm_90 cubin + libtcc host half (fresh process, empty cache)",
                     fms(cu["cold_ms"]), "-", "-", "report", "-"))
        rows.append(("NVRTC cache hit of nms.cu (fresh process)", fms(cu["hit_ms"]), "cold: " + fms(cu["cold_ms"]),
                     "%.0fx faster" % (cu["cold_ms"] / cu["hit_ms"]), "<= 2 ms", yesno(cu["hit_ms"] <= 2)))
    gpu = "n/a: no GPU on this machine" if not R["gpu"] else \
        "n/a: a GPU is present but the anchors (Debian's torch) are CPU-only"
    rows.append(("GPU rows (nms, conv2d, mm on CUDA vs torch CUDA)", gpu, "-", "-", "-", "-"))
    rows.extend(remote_bench.rows(R, fms, yesno))
    for name in sorted(L):
        l = L[name]
        metric = "cache-hit vs cold load, %s (fresh processes, in-process time)" % name
        if "cold_ms" in l and "hit_ms" in l:
            rows.append((metric, "hit " + fms(l["hit_ms"]), "cold " + fms(l["cold_ms"]),
                         "%.0fx faster" % (l["cold_ms"] / l["hit_ms"]), "report", "-"))
        else:
            rows.append((metric, "n/a", "n/a", "n/a", "report",
                         "n/a (%s)" % "; ".join(l.get("errors", ["?"]))[:200]))
    if "python" in R:
        rows.extend(py_bench.rows(R["python"], fms))
    rows.extend(torch2_rows(R))
    if "inline" in R:
        rows.extend(inline_bench.rows(R["inline"], fms))
    return rows


def bench_torch2(py, reps):
    """bench/torch2_bench.py under py, the torch 2 interpreter (with the
    package built for it, $OPJIT_BENCH_TORCH2_PATH): its JSON."""
    if not py or not os.path.exists(py) or not os.environ.get("OPJIT_BENCH_TORCH2_PATH"):
        return {"missing": "no torch 2 interpreter with the package built for it (the deps "
                           "script makes the environment; bench/run builds the package)"}
    out = os.path.join(tempfile.mkdtemp(prefix="opjit-torch2-"), "torch2.json")
    env = dict(os.environ, PYTHONPATH=os.environ.get("OPJIT_BENCH_TORCH2_PATH", ""))
    log("torch2: %s bench/torch2_bench.py" % py)
    r = subprocess.run([py, os.path.join(ROOT, "bench", "torch2_bench.py"), "--reps", str(reps),
                        "--threads", ",".join(map(str, THREADS)), "--out", out], env=env)
    if r.returncode or not os.path.exists(out):
        return {"missing": "bench/torch2_bench.py failed (exit %d)" % r.returncode}
    with open(out) as f:
        return json.load(f)


def torch2_rows(R):
    T = R.get("torch2")
    if T is None:
        return []
    if "missing" in T:
        return [("torch 2 rows (call through torch.ops, training step)", "n/a", "-", "-", "-",
                 "n/a (%s)" % T["missing"])]
    c = T["call"]
    us = c["us"]
    rows = [("call of an opjit op through torch.ops on torch %s (tiny %dx%d mm, 1 thread; schema, "
             "fake kernel and autograd registered)" % (T["torch"].split("+")[0], c["shape"][0],
                                                       c["shape"][1]),
             "%.1f us" % us["opjit_torch_ops"],
             "torch.library.custom_op in Python (torch.mm inside, fake + autograd): %.1f us"
             % us["custom_op_torch_mm"],
             "%.2fx time" % c["ratio"], "<= 1.0x time", yesno(c["ratio"] <= 1.0)),
            ("  for scale: the custom_op wrapping the opjit call; opjit called directly; torch.mm",
             "%.1f us / %.1f us" % (us["custom_op_opjit"], us["opjit_direct"]),
             "torch.mm: %.1f us" % us["torch_mm"], "-", "report", "-")]
    if "missing" in T["train"]:
        rows.append(("training step of a small CNN: opjit conv2d vs F.conv2d", "n/a", "-", "-",
                     "report", "n/a (%s)" % T["train"]["missing"]))
        return rows
    for key in sorted(T["train"], key=lambda k: (int(k.split()[1][:-1]), k)):
        t = T["train"][key]
        rows.append(("training step of a small CNN (3 conv2d, batch 8 of 3x32x32), %s: opjit "
                     "conv2d + torch ops vs F.conv2d" % key,
                     "%.2f ms" % t["ms"]["opjit"], "F.conv2d: %.2f ms" % t["ms"]["torch"],
                     "%.2fx throughput" % t["ratio"], "report", "-"))
    return rows


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return "\n".join(out)


def cpu_ratio(s, num, den):
    """Median over rounds of num's CPU time / den's at 1 thread (a
    single-threaded side's CPU time is its own work, whatever else loads
    the machine); "-" when the row lacks it."""
    a, b = s.get(num + "_cpu_ms_all"), s.get(den + "_cpu_ms_all")
    if not a or not b:
        return "-"
    return "%.2fx" % median([x / y for x, y in zip(a, b) if y > 0])


def conv_md(C, tag, lines):
    """The conv section of latest.md for one instruction set (tag)."""
    if C.get("shapes"):
        lines.append("## conv2d: against oneDNN and torch, both tiers, %s threads%s"
                     % (" and ".join(map(str, THREADS)), tag))
        lines.append("")
        cw = []
        for s in C["shapes"]:
            if "error" in s:
                cw.append((s["label"], "-", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a",
                           s["error"][:100]))
                continue
            for T in THREADS:
                dn = "onednn@%d_ms" % T in s
                cw.append((s["label"] + ("" if s.get("goal") else " (information)"), T,
                           fms(s["opt@%d_ms" % T]), fms(s["tcc@%d_ms" % T]),
                           fms(s["onednn@%d_ms" % T]) if dn else "n/a", fms(s["torch@%d_ms" % T]),
                           "%.1f" % (s["flops"] / s["opt@%d_ms" % T] / 1e6),
                           "%.2fx" % s["ratio_opt_onednn@%d" % T] if dn else "n/a",
                           cpu_ratio(s, "onednn@1", "opt@1") if dn and T == 1 else "-",
                           "%.2fx / %.2fx" % (s["ratio_opt_torch@%d" % T], s["ratio_tcc_torch@%d" % T]),
                           "%s (%s)" % (s["onednn_impl@%d" % T], s["onednn_layout@%d" % T]) if dn else "-"))
        lines.append(md_table(["shape", "threads", "opjit opt", "opjit tcc", "oneDNN", "torch",
                               "GFLOP/s opt", "throughput opt vs oneDNN",
                               "same, CPU time (1 thread)",
                               "throughput opt / tcc vs torch", "oneDNN implementation (layout)"], cw))
        lines.append("")
        if len(THREADS) > 1:
            sw = []
            for s in C["shapes"]:
                if "speedup_opt" in s:
                    sw.append((s["label"], "%.2fx" % s["speedup_opt"], "%.2fx" % s["speedup_tcc"],
                               "%.2fx" % s["speedup_onednn"] if "speedup_onednn" in s else "n/a",
                               "%.2fx" % s["speedup_torch"], "%.1e" % s["max_rel_err"]))
            lines.append("Speed-up from 1 to %d threads (time at 1 / time at %d, per round, median):"
                         % (THREADS[-1], THREADS[-1]))
            lines.append("")
            lines.append(md_table(["shape", "opjit opt", "opjit tcc", "oneDNN", "torch",
                                   "max rel. error vs torch"], sw))
            lines.append("")
        if os.environ.get("OPENBLAS_CORETYPE") and not tag:
            lines.append("Note: this environment sets OPENBLAS_CORETYPE=%s, so OpenBLAS (opjit's conv2d "
                         "and mm GEMMs in the tcc tier, cblas_sgemm, and torch's for some shapes) runs "
                         "the kernels named under Environment below whatever the CPU offers, while "
                         "oneDNN and opjit's optimizing tier use AVX-512 here. `env -u "
                         "OPENBLAS_CORETYPE bench/run` measures with OpenBLAS's own choice."
                         % os.environ["OPENBLAS_CORETYPE"])
            lines.append("")


def best_cpu_ratio(s):
    """cpu_ratio against the faster of cblas_sgemm and dnnl_sgemm, per round."""
    a, b = s.get("sgemm@1_cpu_ms_all"), s.get("dnnl_sgemm@1_cpu_ms_all")
    if not a or not b:
        return "-"
    return cpu_ratio(dict(s, **{"best_cpu_ms_all": [min(x, y) for x, y in zip(a, b)]}),
                     "best", "opt@1")


def mm_md(M, tag, lines):
    """The mm section of latest.md for one instruction set (tag)."""
    if M.get("sizes"):
        lines.append("## mm: both tiers against cblas_sgemm and oneDNN's dnnl_sgemm, %s threads%s"
                     % (" and ".join(map(str, THREADS)), tag))
        lines.append("")
        mw = []
        for n, s in M["sizes"].items():
            if "error" in s:
                mw.append((n, "-", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a",
                           s["error"][:100]))
                continue
            for T in THREADS:
                dn = "dnnl_sgemm@%d_ms" % T in s
                mw.append((n, T, fms(s["opt@%d_ms" % T]), fms(s["tcc@%d_ms" % T]),
                           fms(s["sgemm@%d_ms" % T]),
                           "%s (%s)" % (fms(s["dnnl_sgemm@%d_ms" % T]), s["dnnl_impl@%d" % T])
                           if dn else "n/a", "%.3fx" % s["ratio_opt@%d" % T],
                           "%.3fx" % s["ratio_opt_best@%d" % T] if dn else "n/a",
                           best_cpu_ratio(s) if dn and T == 1 else "-",
                           "%.3fx" % s["ratio_tcc@%d" % T], "%.1e" % s["max_rel_err"]))
        lines.append(md_table(["n", "threads", "opjit opt", "opjit tcc", "cblas_sgemm",
                               "dnnl_sgemm (ISA)", "throughput opt vs cblas",
                               "opt vs the faster", "same, CPU time (1 thread)",
                               "throughput tcc vs cblas",
                               "max rel. error vs float64"], mw))
        lines.append("")


ISA_NOTE = (
    "These rows are **emulated AVX2**: measured on the machine under Environment (it has "
    "AVX-512) with every side capped at AVX2 (`bench/run --isa avx2`): opjit's optimizing tier "
    "built for x86-64-v3 (`OPJIT_CPU_LEVEL=avx2`: its AVX2 GEMM and Winograd kernels), oneDNN "
    "with `ONEDNN_MAX_CPU_ISA=AVX2` (its implementation names say so), OpenBLAS with "
    "`OPENBLAS_CORETYPE=Haswell`, torch with `ATEN_CPU_CAPABILITY=avx2`. The caches and clocks "
    "are this machine's, not an AVX2 machine's.")


def write_md(R, path):
    rows = build_rows(R)
    env = R["env"]
    L = R["loads"]
    lines = []
    lines.append("# opjit benchmarks: latest run")
    lines.append("")
    if SMOKE:
        # No goals: tiny inputs say nothing about them.
        rows = [(m, o, a, r, "-", met if str(met).startswith("n/a") else "-")
                for m, o, a, r, g, met in rows]
        lines.append("**A smoke run (`bench/run --smoke`)**: every section on tiny inputs, one "
                     "repetition, a twentieth of the usual time each; it checks that every anchor "
                     "builds and runs and every row gets a value. No figure here is a measurement "
                     "to quote.")
        lines.append("")
    lines.append("Written by `bench/run` on %s (git %s%s), %s, %d CPUs usable. Every figure is "
                 "the median of several repetitions; opjit and its anchor run in the same run, "
                 "interleaved repetition by repetition, on the same inputs "
                 "(bench/results/inputs/*.npy, written once with numpy and read by both sides). "
                 "Loads and the call overhead run on one thread; nms, conv2d and mm run at %s "
                 "threads, every thread count side by side in the same rounds, every side at the "
                 "same count (opjit's cfg.num_threads, torch.set_num_threads, oneDNN's OpenMP "
                 "threads, openblas_set_num_threads). The machine is shared and noisy: read the "
                 "ratios, not the absolute times."
                 % (env["date"], env["git"], " + local changes" if env["dirty"] else "", env["cpu"],
                    NCPU, " and ".join(map(str, THREADS))))
    lines.append("")
    for m in R.get("merged_before", []) + ([R["merged"]] if "merged" in R else []):
        isa = m.get("isa", "native")
        lines.append("Rerun on %s (git %s%s, `bench/run --merge --only %s%s`, %.0f s) and merged "
                     "into the run above: %s. Every other figure is from the run above."
                     % (m["env"]["date"], m["env"]["git"],
                        " + local changes" if m["env"]["dirty"] else "", ",".join(m["sections"]),
                        "" if isa == "native" else " --isa " + isa, m["elapsed_s"],
                        ", ".join(s + ("" if isa == "native" else " (%s)" % isa)
                                  for s in m["sections"])))
        lines.append("")
    # What a person wrote about these runs (the machines, a row's cause):
    # kept in notes.md beside latest.md, so that a rerun carries it over.
    notes = os.path.join(os.path.dirname(path), "notes.md")
    if not SMOKE and os.path.exists(notes):
        with open(notes) as f:
            lines.append(f.read().strip())
        lines.append("")
    lines.append(md_table(["metric", "opjit", "anchor", "ratio", "goal", "met?"], rows))
    lines.append("")
    lines.append("![nms time against box count](nms.png)")
    lines.append("")

    N = R.get("nms", {})
    if N.get("sizes"):
        lines.append("## nms: the sweep (plotted in nms.png)")
        lines.append("")
        sw = []
        for n, s in sorted(N["sizes"].items()):
            sw.append((n, s["kept"], fms(s["tcc_ms"]), fms(s["opt_ms"]), fms(s["torchvision_ms"]),
                       "%.2fx (%.2fx)" % (s["ratio_tcc"], s["ratio_cpu_tcc"]),
                       "%.2fx (%.2fx)" % (s["ratio_opt"], s["ratio_cpu_opt"]),
                       "yes" if s["match_tcc"] and s["match_opt"] else "**no**"))
        lines.append(md_table(["boxes", "kept", "opjit tcc", "opjit opt", "torchvision",
                               "tcc/tv time (CPU time)", "opt/tv time (CPU time)",
                               "same indices as torchvision"], sw))
        lines.append("")
    if N.get("threaded"):
        lines.append("## nms at %s threads" % " and ".join(map(str, THREADS)))
        lines.append("")
        nw = []
        for n, s in sorted(N["threaded"].items()):
            for T in THREADS:
                nw.append((n, s["kept"], T, fms(s["opt@%d_ms" % T]), fms(s["torchvision@%d_ms" % T]),
                           "%.3fx" % s["ratio@%d" % T],
                           "%.2fx" % s["speedup"] if T > 1 and "speedup" in s else "-",
                           "yes" if s["match"] else "**no**"))
        lines.append(md_table(["boxes", "kept", "threads", "opjit opt", "torchvision",
                               "opt/tv time", "opt speed-up over 1 thread",
                               "same indices as torchvision"], nw))
        lines.append("")
        lines.append("nms splits the grid walk into blocks of 1024 boxes: each box of a block is "
                     "tested against the boxes kept before the block on all threads, then against "
                     "those kept inside it in order on the calling thread; the sort and the setup "
                     "stay on one thread. torchvision's CPU nms is one loop on one thread.")
        lines.append("")
    for suf in ("", "_avx2"):
        if suf and (R.get("conv2d" + suf, {}).get("shapes") or R.get("mm" + suf, {}).get("sizes")):
            lines += ["## AVX2 rows, emulated", "", ISA_NOTE, ""]
        conv_md(R.get("conv2d" + suf, {}), ISA_TAG[suf], lines)
        mm_md(R.get("mm" + suf, {}), ISA_TAG[suf], lines)
    C, M = R.get("conv2d", {}), R.get("mm", {})
    lines.extend(backward_bench.md_section(R.get("backward"), fms, md_table))
    lines.extend(half_bench.md_section(R.get("half"), fms, md_table))
    H = R.get("hosts", {})
    if H.get("sides"):
        lines.append("## Many host threads, one runtime")
        lines.append("")
        lines.append("conv2d %s (opt tier), called in a loop by every host thread at once; time per "
                     "call is wall time / all calls made (the inverse of throughput):" % H["shape"])
        lines.append("")
        base = H[H["sides"][0] + "_ms"]
        lines.append(md_table(["callers, runtime", "time per call", "throughput vs the first"],
                              [(n, fms(H[n + "_ms"]), "%.2fx" % (base / H[n + "_ms"]))
                               for n in H["sides"]]))
        lines.append("")
        lines.append("One loop runs on the pool at a time; a loop that finds it busy runs inline on "
                     "its own host thread. So with as many host threads as cores each call mostly "
                     "runs on one thread, and the machine stays at about one busy thread per core.")
        lines.append("")
    FT = R.get("faults", {})
    if "fresh_us" in FT:
        lines.append("## Page faults")
        lines.append("")
        lines.append("Touching a page of a fresh mapping costs %.2f us here (%.2f us for a second "
                     "mapping, whose pages the first gave back), rewriting a touched one %.3f us "
                     "(per 4 KiB page, a 32 MiB buffer). Minor faults per call, steady state (median "
                     "over rounds), and what they cost at the second rate, as a share of the call:"
                     % (FT["fresh_us"], FT["again_us"], FT["reuse_us"]))
        lines.append("")
        fw = []

        def share(row, side):
            f, ms = row.get(side + "_flt"), row.get(side + "_ms")
            if f is None or ms is None or f != f:
                return "n/a"
            return "%.1f (%.0f%%)" % (f, min(100.0, 100.0 * f * FT["again_us"] / 1e3 / ms))
        for s in C.get("shapes", []):
            if "opt@1_ms" in s:
                for T in THREADS:
                    fw.append(("conv2d %s, %s" % (s["label"], thr(T)), share(s, "opt@%d" % T),
                               share(s, "onednn@%d" % T), share(s, "torch@%d" % T)))
        for n, s in M.get("sizes", {}).items():
            if n == 2048 and "opt@1_ms" in s:
                for T in THREADS:
                    fw.append(("mm %d, %s" % (n, thr(T)), share(s, "opt@%d" % T),
                               "cblas_sgemm (preallocated C): " + share(s, "sgemm@%d" % T), "-"))
        for n, s in sorted(N.get("threaded", {}).items()):
            for T in THREADS:
                if "opt@%d_ms" % T in s:
                    fw.append(("nms %d, %s" % (n, thr(T)), share(s, "opt@%d" % T), "-",
                               "torchvision: " + share(s, "torchvision@%d" % T)))
        lines.append(md_table(["call", "opjit opt", "oneDNN anchor", "torch"], fw))
        lines.append("")
        lines.append("opjit's outputs come from the default allocator's cache of large blocks "
                     "(runtime/alloc.c, `OPJIT_OUTPUT_CACHE`) and its scratch from the runtime's "
                     "reused workspaces; the oneDNN anchor mallocs and frees its NCHW output every "
                     "call (glibc reuses the block in a loop) and keeps its scratchpad in the "
                     "primitive; torch allocates output and scratch through glibc every call, and "
                     "blocks above glibc's mmap threshold (32 MiB at most) are mapped and unmapped "
                     "each time. The first call of a shape faults its output in on every side.")
        lines.append("")
    lines.extend(py_bench.md_section(R.get("python", {}), fms))
    lines.extend(inline_bench.md_section(R.get("inline", {}), fms))
    lines.extend(remote_bench.md_section(R, fms))
    lines.append("## loads, per op (fresh processes, medians of %d)" % R["reps_load"])
    lines.append("")
    lw = []
    for name in sorted(L):
        l = L[name]
        if "cold_ms" not in l:
            lw.append((name, "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a",
                       "; ".join(l.get("errors", ["?"]))[:150]))
            continue
        def mm_(k):
            return "%s (%s)" % (fms(l.get(k)), fms(min(l[k + "_all"]))) if k in l else "n/a"
        lw.append((name, mm_("cold_ms"), fms(l.get("cold_compile_ms")), mm_("hit_ms"),
                   fms(l.get("hitdl_ms")), fms(l.get("hit_wall_ms")),
                   "%s (%s)" % (mm_("opthit_ms"), l.get("opthit_tier", "-")),
                   mm_("cc_ms"), fms(l.get("dlopen_ms")), "; ".join(l.get("errors", [])) or ""))
    lines.append(md_table(["source", "cold (min)", "of which compile + publish", "hit (min)",
                           "dlopen + dlsym of the hit's artifact", "hit, process wall",
                           "hit, opt artifact (min) (tier)", "cc -O2 + dlopen (min)",
                           "dlopen of that .so", "errors"], lw))
    lines.append("")
    co = R.get("call_overhead", {})
    if "overhead_opt_ns" in co:
        lines.append("Call overhead: opt tier kernel +%.0f ns (by thread CPU time +%.0f ns); "
                     "tcc tier kernel %.0f ns/call, +%.0f ns (CPU time +%.0f ns) over the direct "
                     "call (%.0f ns)."
                     % (co["overhead_opt_ns"], co["overhead_cpu_opt_ns"], co["opjit_tcc_ns"],
                        co["overhead_tcc_ns"], co["overhead_cpu_tcc_ns"], co["direct_ns"]))
        lines.append("")
    lines.append("## How each figure is measured")
    lines.append("")
    lines.append("""- **Cold load**: per repetition, a fresh process (posix_spawn of `opjit_bench load-once`)
  with an empty `OPJIT_CACHE_DIR` (mkdtemp) and `OPJIT_TIERING=0` times `opjit_create` +
  `opjit_load_file(ops-src/nms.c)` inside the process (libtcc compile, cache publish, dlopen,
  module init, registration). The anchor, in another fresh process, times the spawn of
  `cc -O2 -shared -fPIC -I include -I /usr/include/x86_64-linux-gnu ... -lopenblas -lm` to its
  exit, `dlopen` of the result and `dlsym(opjit_module_init)`. The first of %d+1 repetitions is
  dropped (cold page cache); medians of the rest; the speed-up is the median of the per-repetition
  ratios. Beside it, in a fourth fresh process (`opjit_bench tcc-once`): libtcc alone
  compiles the file with the same include directories, defines and -lm, writes the .so,
  `dlopen` + `dlsym`; no cache, key, copy of the text or checks. A loader that hands libtcc the
  source as it is cannot be faster than that; opjit compiles the op after `<opjit_op.h>` and the
  system headers under it preprocessed when the library was built (jit/tcc_prelude.h), so it can.
- **Cache-hit load**: right after the cold load, a second fresh process with the same cache
  (tiering off) times `opjit_create` + `opjit_load_file`, in-process: hashing the source and
  its headers, the key, the cache's checks of the entry (lock, owner and link checks, manifest,
  sizes, checksums, ELF completeness, the listing), `dlopen`, the module's init and
  registration. Its anchor is a third fresh process timing `dlopen` + `dlsym` of the very
  artifact the hit loaded (the entry's host.so); the ratio is the median of the
  per-repetition ratios. The whole-process wall time (posix_spawn to waitpid) is shown for
  information, against a process doing only that dlopen. "opt artifact": a process with
  tiering on first leaves the cc -O2 artifact in the cache (untimed); a fresh process with
  tiering on then loads it (a hit serving the opt tier), shown against a dlopen of the
  cc-built .so. `opjit_bench` does not link OpenBLAS (its cblas_sgemm anchor dlopens it in the
  serve process): these processes have no library a host would not have loaded.
  The floor beside each hit, in a fourth fresh process (`opjit_bench hit-floor`): what
  any correct hit must do, each step done plainly: read and hash the source, read the manifest
  (its end line checked), read and hash each header it lists, check those sums against it,
  read and hash the artifact against its artifact line (for a .cu, the same of its device
  code's entry: its manifest, checked against the same source, and its cubin), `dlopen` +
  `dlsym`. No runtime, settings, trust checks of the cache's directories, lock, key,
  compiler identity or registration: the difference is what opjit adds to it.
- **Instructions**: `valgrind --tool=callgrind` of whole `build/opjit` processes (the count is
  the same on every run, whatever the load of the machine): `opjit --version`, and
  `opjit -q load ops-src/nms.c` with `OPJIT_TIERING=0` on a cache one such load filled.
- **Whole-process cold load**: `build/opjit -q load ops-src/nms.c` timed from spawn to exit
  on an empty cache, tiering on (the optimizing compile handed to a detached helper), against
  `cc -O2 -shared` of the file; once the helper's code is in the cache (the next process must
  be served by it), two floors are timed the same way: the same load with `OPJIT_TIERING=0`
  (what starting the helper costs the host is the difference) and the `tcc` program alone
  (`tcc -shared`, the same include directories and defines, -lm).
- **Call overhead**: `opjit_call` of `bench/ops/add1.c` (`add1(Tensor self) -> Tensor`,
  float32 contiguous required; the kernel allocates its output with `opjit_output` and writes
  x + 1) on a 1-element tensor, followed by the output's deleter, against a direct C function
  compiled with -O2 into the bench program and called through a function pointer, doing the
  same work: one malloc holding a DLManagedTensor, the shape and 64-byte-aligned data, fields
  filled in, x + 1, freed by its deleter. The overhead is the difference of the two per-call
  times, per repetition (same round), median. It includes the schema and requirement checks,
  argument binding, the kernel and api-table indirections and the output bookkeeping.
- **nms**: random boxes (x1, y1 uniform in [0, 1000), w, h uniform in [10, 110), scores
  uniform, float32), IoU 0.5. opjit runs in a coprocess (`opjit_bench serve`) holding two
  runtimes with separate caches: tiering off (the libtcc code: "tcc") and tiering on after
  `opjit_wait` (the cc -O2 code: "opt"; `opjit_op_info_get` confirms the tier). torchvision
  0.14's `torchvision.ops.nms` runs in the Python driver on tensors made from the same .npy
  files (copied into torch-allocated, 64-byte aligned memory, as the C side's are). Per size, each side is calibrated to about 0.15 s per repetition (many calls), then
  rounds of one repetition per side follow (the order rotating); times are medians per call,
  and **every ratio is the median over rounds of the ratio within a round**, so a burst of load
  from other processes hits both sides of the ratio it lands in. The secondary tables give the
  same ratio by thread CPU time (CLOCK_THREAD_CPUTIME_ID / time.thread_time(), blind to time the
  core was taken away) as a cross-check. Both sides include allocating their output. The kept
  indices are compared with torchvision's (count and an order-weighted sum).
- **Threads**: every side of an nms, conv2d or mm row runs at the row's thread count: opjit
  through runtimes created with `cfg.num_threads` (one per tier and count in the coprocess),
  torch with `torch.set_num_threads`, oneDNN with `omp_set_num_threads` before its primitives are
  made, cblas_sgemm with `openblas_set_num_threads` (set back to 1 after, as opjit's runtime keeps
  it). All thread counts of a row are sides of the same interleaved rounds, so a speed-up is a
  ratio within rounds too. After each repetition the driver sleeps %.2f s when several threads
  ran, so threads of OpenMP or OpenBLAS still spinning after their call do not take cores from
  the next side (opjit's pool never spins).
- **conv2d**: ResNet-50 layer shapes, batch 1 and 8, NCHW float32, no bias. The anchor is
  oneDNN %s through its C API (bench/dnnl_anchor.c, a coprocess): for each shape and thread
  count it sets up a primitive on plain NCHW tensors and one on the blocked layouts oneDNN picks
  (weights reordered into its format once, untimed), times both and keeps the faster; a call of
  the blocked one includes reordering the NCHW input in and the output back to NCHW. Each call
  allocates its NCHW output (malloc/free), as opjit's does. `torch.nn.functional.conv2d` under
  `torch.no_grad()` is shown too (torch 1.13 calls oneDNN for most shapes, but its slow path
  for a 1x1 convolution with batch < 16 on one thread). Throughput ratio = anchor time / opjit
  time. The opjit output is checked against torch's.
- **mm**: square float32 products through the `mm` op against `cblas_sgemm` called directly
  from the same C process (OpenBLAS at the same thread count) into a preallocated result, and
  against oneDNN's `dnnl_sgemm` (the oneDNN anchor, OpenMP at the same thread count, a
  preallocated result; the ISA it dispatched to in brackets); the goal row takes the faster of
  the two in each round. The op also allocates its result on every call.
- **Page faults**: minor faults per call from getrusage around each repetition (the whole
  process: opjit's coprocess, the anchor's, torch's driver), divided by the calls.
- **NVRTC**: `opjit_load_file(ops-src/nms.cu)` with `OPJIT_CUDA_ARCHS=sm_90`, cold (empty cache)
  and cache hit, fresh processes as for the cold load.
""" % (R["reps_load"], SETTLE, R["env"].get("onednn", "?")) + py_bench.HOW + inline_bench.HOW)
    lines.append("## Environment")
    lines.append("")
    for k in ("cpu", "cores", "threads", "kernel", "python", "torch", "torchvision", "numpy",
              "openblas", "onednn", "cc", "tcc", "reps"):
        lines.append("- %s: %s" % (k, env.get(k)))
    lines.append("- run time: %.0f s" % R["elapsed_s"])
    lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def plot_nms(R, path, tmp):
    N = R.get("nms", {})
    if not N.get("sizes") or not shutil.which("gnuplot"):
        log("no nms plot (%s)" % ("gnuplot missing" if N.get("sizes") else N.get("missing", "no data")))
        return False
    dat = os.path.join(tmp, "nms.dat")
    with open(dat, "w") as f:
        f.write("# boxes tcc_ms opt_ms torchvision_ms\n")
        for n, s in sorted(N["sizes"].items()):
            f.write("%d %.6f %.6f %.6f\n" % (n, s["tcc_ms"], s["opt_ms"], s["torchvision_ms"]))
    terms = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, text=True)
    listing = terms.stdout + terms.stderr
    term = "pngcairo size 960,640 font 'Sans,11'" if "pngcairo" in listing else "png size 960,640"
    script = """
set terminal %s
set output '%s'
set title "nms on the CPU: random boxes, IoU 0.5, one thread (median of %d repetitions)"
set xlabel "boxes"
set ylabel "time per call (ms)"
set logscale xy
set grid xtics ytics mxtics mytics
set key top left box opaque
set xrange [420:12000]
set xtics (500, 1000, 2000, 4000, 7000, 10000)
set format y "%%g"
plot '%s' using 1:2 with linespoints lw 2 pt 7 title "opjit, tcc tier (libtcc)", \\
     '' using 1:3 with linespoints lw 2 pt 5 title "opjit, opt tier (cc -O2)", \\
     '' using 1:4 with linespoints lw 2 pt 9 title "torchvision.ops.nms 0.14"
""" % (term, path, R["reps"], dat)
    p = subprocess.run(["gnuplot"], input=script, capture_output=True, text=True)
    if p.returncode != 0:
        log("gnuplot failed: %s" % p.stderr)
        return False
    return True


def openblas_core():
    """The kernels OpenBLAS picked on this CPU (both sides use the same
    library and environment: OPENBLAS_CORETYPE, if set, is inherited)."""
    try:
        import ctypes
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        lib.openblas_get_config.restype = ctypes.c_char_p
        return "%s kernels (%s)%s" % (lib.openblas_get_corename().decode(),
                                      lib.openblas_get_config().decode().strip(),
                                      ", OPENBLAS_CORETYPE=" + os.environ["OPENBLAS_CORETYPE"]
                                      if os.environ.get("OPENBLAS_CORETYPE") else "")
    except Exception as e:  # noqa: BLE001
        return "? (%s)" % e


def environment(reps):
    def cmd(args):
        try:
            return subprocess.run(args, capture_output=True, text=True).stdout.splitlines()[0]
        except Exception:
            return "?"
    info = {}
    with open("/proc/cpuinfo") as f:
        for l in f:
            if ":" in l:
                k, v = l.split(":", 1)
                info.setdefault(k.strip(), v.strip())
    flags = info.get("flags", "").split()
    isa = ("AVX-512" if "avx512f" in flags else "AVX2, no AVX-512" if "avx2" in flags
           else "no AVX2")
    cpu = "%s (family %s, model %s, %s)" % (
        info.get("model name", "?"), info.get("cpu family", "?"), info.get("model", "?"), isa)
    git = cmd(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    dirty = bool(subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True).stdout.strip())
    return {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "git": git, "dirty": dirty, "cpu": cpu, "cores": os.cpu_count(),
        "kernel": platform.release(), "python": platform.python_version(),
        "torch": torch.__version__, "torchvision": torchvision.__version__,
        "numpy": np.__version__, "cc": cmd(["cc", "--version"]), "tcc": cmd(["tcc", "-v"]),
        "openblas": openblas_core(), "reps": reps,
        "threads": "%s (the CPUs this process may run on: %d)" % (",".join(map(str, THREADS)), NCPU),
        "onednn": cmd(["dpkg-query", "-W", "-f", "${Version}", "libdnnl-dev"]) or "?",
    }


# ---- lookup of an op by name (loader/index.c) ---------------------------------

LOOKUP_MODULE = """#include <opjit_op.h>
static int k(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }
OPJIT_MODULE(mod_%05d, m) { opjit_def(m, "op_%05d(Tensor x) -> Tensor", OPJIT_CPU, k, ""); }
"""
LOOKUP_SIZES = (50, 10000)


def bench_lookup(exe, reps, tmp, nsrc=50):
    """opjit_load_op(rt, "rmsnorm") with samples/ops/llama_ops.c among nsrc
    sources (the others tiny modules of one op each), the index warm, each
    load in a fresh runtime; against opjit_load_file of llama_ops.c (the
    same load without the lookup). The first lookup indexes them all, one
    discovery child per CPU at once (information)."""
    d = os.path.join(tmp, "lookup-ops-%d" % nsrc)
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(ROOT, "samples", "ops", "llama_ops.c"), d)
    for i in range(nsrc - 1):
        with open(os.path.join(d, "mod_%05d.c" % i), "w") as f:
            f.write(LOOKUP_MODULE % (i, i))
    time.sleep(2.2)  # past the index's racy window, so its directory note is kept
    env = dict(os.environ, OPJIT_CACHE_DIR=os.path.join(tmp, "lookup-cache-%d" % nsrc))
    res = {"sources": nsrc, "cpus": len(os.sched_getaffinity(0))}
    for what, n in (("cold", 1), ("warm", max(3 * reps, 11))):
        p = subprocess.run([exe, "lookup", d, "rmsnorm", "llama_ops.c", str(n)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=3600)
        line = (p.stdout.strip().splitlines() or ["err no output"])[-1]
        if p.returncode != 0 or not line.startswith("ok "):
            return {"error": ("%s: %s %s" % (what, line, p.stderr.strip()))[:200]}
        vals = {k: float(v) for k, v in (w.split("=") for w in line.split()[1:])}
        res[what] = vals
    w = res["warm"]
    res["lookup_ms"] = w["name_ms"] - w["path_ms"]
    res["cold_index_ms"] = res["cold"]["name_ms"]
    return res


def lookup_rows(R):
    rows = []
    for nsrc in LOOKUP_SIZES:
        lk = R.get("lookup" if nsrc == 50 else "lookup_%d" % nsrc)
        if not lk:
            continue
        metric = ("lookup of an op by name in a multi-op module (rmsnorm of llama_ops.c) among %d "
                  "sources, warm cache, fresh runtime: opjit_load_op by name minus opjit_load_file"
                  % nsrc)
        if "error" in lk:
            rows.append((metric, "n/a", "n/a", "n/a", "<= 1 ms", "n/a (%s)" % lk["error"]))
            continue
        w = lk["warm"]
        rows += [(metric, fms(lk["lookup_ms"]),
                  "by path: %s, by name: %s" % (fms(w["path_ms"]), fms(w["name_ms"])),
                  "+%s" % fms(lk["lookup_ms"]), "<= 1 ms, compiles nothing",
                  yesno(lk["lookup_ms"] <= 1.0)),
                 ("  same, the first lookup (indexes the %d sources, one child process per CPU "
                  "at once, %s CPUs; information)" % (nsrc, lk.get("cpus", "?")),
                  fms(lk["cold_index_ms"]), "-", "-", "report", "-")]
    return rows


# ---- a cold `opjit load` as a whole process (the optimizer detached) ----------

def bench_cli_cold(reps, tmp):
    """Spawn to exit: `build/opjit load ops-src/nms.c` on an empty cache with
    tiering on (the optimizing compile goes to a detached helper), against
    `cc -O2 -shared` of the same file; alternated. Then, untimed, the
    helper's code must reach the cache, and the next `opjit load` must be
    served by it. Once it is, for the report: the same load with tiering
    off, and `tcc -shared` of the file (the floor of any load through tcc)."""
    cli = os.path.join(ROOT, "build", "opjit")
    if not os.path.exists(cli):
        return {"error": "build/opjit missing"}
    src = "ops-src/nms.c"
    cc = ["cc", "-O2", "-shared", "-fPIC", "-I", "include", "-I", "/usr/include/x86_64-linux-gnu",
          "-o", os.path.join(tmp, "cli-cc.so"), src, "-lopenblas", "-lm"]
    # The floors, for the report: the same load with tiering off (no
    # helper to start), and the tcc program compiling the file alone.
    tcc = ["tcc", "-shared", "-I", "include", "-I", os.path.dirname(src), "-I",
           "/usr/include/x86_64-linux-gnu", "-DFORCE_OPENBLAS_COMPLEX_STRUCT", "-DOPJIT_TIER_TCC",
           "-o", os.path.join(tmp, "cli-tcc.so"), src, "-lm"]
    has_tcc = shutil.which("tcc") is not None
    res = {"cold_ms_all": [], "cc_ms_all": [], "next_tier": [], "opt_after_ms_all": [],
           "notier_ms_all": [], "tcc_ms_all": []}
    for r in range(reps + 1):
        cache = os.path.join(tmp, "cli-cache-%d" % r)
        env = dict(os.environ, OPJIT_CACHE_DIR=cache)
        env.pop("OPJIT_TIERING", None)
        t0 = time.perf_counter()
        p = subprocess.run([cli, "-q", "load", src], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
        cold = (time.perf_counter() - t0) * 1e3
        if p.returncode != 0 or "[tcc]" not in p.stdout:
            return {"error": ("opjit load: %s %s" % (p.stdout, p.stderr)).strip()[:200]}
        t1 = time.perf_counter()
        while time.perf_counter() - t1 < 120:  # the helper publishes after the process exited
            ls = subprocess.run([cli, "cache", "ls", "--all", "--json"], cwd=ROOT, env=env,
                                capture_output=True, text=True)
            try:
                tiers = [e["tier"] for e in json.loads(ls.stdout)]
            except ValueError:
                tiers = []
            if tiers.count("opt") == 1 and tiers.count("opt-index") == 2:
                break  # the entry and its two index entries (by this cc, by none)
            time.sleep(0.02)
        opt_after = (time.perf_counter() - t1) * 1e3
        n = subprocess.run([cli, "-q", "load", src], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
        # with the helper done: nothing else runs
        off = dict(env, OPJIT_CACHE_DIR=cache + "-notier", OPJIT_TIERING="0")
        t0 = time.perf_counter()
        p = subprocess.run([cli, "-q", "load", src], cwd=ROOT, env=off, capture_output=True,
                           text=True, timeout=600)
        notier = (time.perf_counter() - t0) * 1e3
        if p.returncode != 0:
            return {"error": ("opjit load (tiering off): %s %s" % (p.stdout, p.stderr)).strip()[:200]}
        tcc_ms = None
        if has_tcc:
            t0 = time.perf_counter()
            p = subprocess.run(tcc, cwd=ROOT, capture_output=True, text=True, timeout=600)
            tcc_ms = (time.perf_counter() - t0) * 1e3 if p.returncode == 0 else None
        t2 = time.perf_counter()
        c = subprocess.run(cc, cwd=ROOT, capture_output=True, text=True, timeout=600)
        cc_ms = (time.perf_counter() - t2) * 1e3
        if c.returncode != 0:
            return {"error": ("cc: " + c.stderr).strip()[:200]}
        if r == 0:
            continue  # the first round warms the page cache
        res["cold_ms_all"].append(cold)
        res["cc_ms_all"].append(cc_ms)
        res["notier_ms_all"].append(notier)
        if tcc_ms is not None:
            res["tcc_ms_all"].append(tcc_ms)
        res["opt_after_ms_all"].append(opt_after)
        res["next_tier"].append("opt" if "[opt]" in n.stdout else "tcc")
    res["cold_ms"] = median(res["cold_ms_all"])
    res["cc_ms"] = median(res["cc_ms_all"])
    res["opt_after_ms"] = median(res["opt_after_ms_all"])
    res["speedup"] = median([c / o for c, o in zip(res["cc_ms_all"], res["cold_ms_all"])])
    res["notier_ms"] = median(res["notier_ms_all"])
    if res["tcc_ms_all"]:
        res["tcc_ms"] = median(res["tcc_ms_all"])
    return res


def callgrind_instructions(args, env):
    """Instructions a whole process executes (valgrind's callgrind): the
    same count on every run, however loaded the machine is."""
    p = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] + args,
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    for line in p.stderr.splitlines():
        if "Collected :" in line:
            return int(line.split(":")[-1].strip())
    raise BenchError("callgrind of %s: %s" % (" ".join(args), p.stderr.strip()[-200:]))


def bench_instr(tmp):
    """What a process that links opjit pays before and for a cache hit, in
    instructions: `opjit --version`, and a whole `opjit -q load` of nms.c
    served by the cache (tiering off); /bin/true for scale."""
    if not shutil.which("valgrind"):
        return {"error": "valgrind not installed"}
    cli = os.path.join(ROOT, "build", "opjit")
    env = dict(os.environ, OPJIT_CACHE_DIR=os.path.join(tmp, "instr-cache"), OPJIT_TIERING="0")
    env.pop("OPJIT_REMOTE_CACHE", None)
    try:
        subprocess.run([cli, "-q", "load", "ops-src/nms.c"], cwd=ROOT, env=env, check=True,
                       capture_output=True, timeout=600)  # fills the cache
        return {"true": callgrind_instructions(["/bin/true"], env),
                "version": callgrind_instructions([cli, "--version"], env),
                "hit": callgrind_instructions([cli, "-q", "load", "ops-src/nms.c"], env)}
    except (BenchError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)[:200]}


def instr_rows(R):
    ins = R.get("instr")
    if not ins:
        return []
    m1 = "instructions of a whole `opjit --version` process (callgrind)"
    m2 = ("instructions of a whole cache-hit `opjit -q load ops-src/nms.c` process, tiering off "
          "(callgrind)")
    if "error" in ins:
        return [(m, "n/a", "n/a", "n/a", g, "n/a (%s)" % ins["error"])
                for m, g in ((m1, "<= 0.4 M"), (m2, "<= 1.0 M"))]
    t = "`/bin/true`: %.2f M" % (ins["true"] / 1e6)
    return [(m1, "%.2f M" % (ins["version"] / 1e6), t, "-", "<= 0.4 M",
             yesno(ins["version"] <= 0.4e6)),
            (m2, "%.2f M" % (ins["hit"] / 1e6), t, "-", "<= 1.0 M", yesno(ins["hit"] <= 1.0e6))]


def cli_rows(R):
    cl = R.get("cli")
    if not cl:
        return instr_rows(R)
    metric = ("cold `opjit load ops-src/nms.c`, whole process (spawn to exit), empty cache, "
              "tiering on (the optimizing compile detached)")
    if "error" in cl:
        return instr_rows(R) + [(metric, "n/a", "n/a", "n/a", ">= 40x faster",
                                 "n/a (%s)" % cl["error"])]
    tiers = sorted(set(cl["next_tier"]))
    return instr_rows(R) + [(metric, fms(cl["cold_ms"]), "`cc -O2 -shared` of nms.c, whole process: " +
             fms(cl["cc_ms"]), "%.1fx faster" % cl["speedup"], ">= 40x faster",
             yesno(cl["speedup"] >= 40)),
            ("  the same load with tiering off (no helper started), whole process (information)",
             fms(cl.get("notier_ms")), "`cc -O2 -shared`: " + fms(cl["cc_ms"]),
             "%.1fx faster" % (cl["cc_ms"] / cl["notier_ms"]) if cl.get("notier_ms") else "n/a",
             "report", "-"),
            ("  the floor: `tcc -shared` of nms.c alone (no cache, key or checks), whole process",
             fms(cl.get("tcc_ms")) if "tcc_ms" in cl else "n/a (no tcc program)",
             "`cc -O2 -shared`: " + fms(cl["cc_ms"]),
             "%.1fx faster" % (cl["cc_ms"] / cl["tcc_ms"]) if cl.get("tcc_ms") else "n/a",
             "report", "-"),
            ("  the next process: served by the optimized code the helper left (tier %s); "
             "the helper's code reached the cache %s after the first process exited"
             % (",".join(tiers), fms(cl["opt_after_ms"])), "-", "-", "-", "next tier opt",
             yesno(tiers == ["opt"]))]


# What each --only section writes into the results.
SECTION_KEYS = {"loads": ["loads", "ran_loads", "full_cache"], "call": ["call_overhead"], "nms": ["nms"],
                "conv2d": ["conv2d"], "mm": ["mm"], "python": ["python"],
                "lookup": ["lookup", "lookup_10000"], "cli": ["cli", "instr"], "remote": ["remote"],
                "backward": ["backward"], "half": ["half"], "torch2": ["torch2"],
                "inline": ["inline"]}


def merged_results(path, fresh, only):
    """--merge: the sections named by --only from this run, every other
    from the run that wrote path (its date and environment stay; the report
    says which sections were rerun, and when)."""
    with open(path) as f:
        R = json.load(f)
    for sec, sub in (("nms", "sizes"), ("nms", "threaded"), ("mm", "sizes"), ("mm_avx2", "sizes")):
        # JSON turned their integer keys into strings
        if isinstance(R.get(sec), dict) and sub in R[sec]:
            R[sec][sub] = {int(k): v for k, v in R[sec][sub].items()}
    for sec in only:
        for k in SECTION_KEYS[sec]:
            k += ISA_SUFFIX if sec in ("conv2d", "mm") else ""
            if k in fresh:
                R[k] = fresh[k]
    # earlier reruns stay on the record, less the sections this one replaces
    earlier = R.get("merged_before", []) + ([R["merged"]] if "merged" in R else [])
    R["merged_before"] = [m for m in earlier if set(m["sections"]) - set(only) or
                          m.get("isa", "native") != ISA]
    R["merged"] = {"sections": sorted(only), "isa": ISA, "env": fresh["env"],
                   "elapsed_s": fresh["elapsed_s"]}
    return R


def smoke_setup():
    """--smoke: what the sections measure, on tiny inputs (in their own
    inputs and results directories, so the committed ones stay), one
    repetition, a twentieth of the usual time per repetition; the child
    scripts (backward, torch2, inline) read OPJIT_BENCH_SMOKE."""
    global SMOKE, TARGET_SCALE, INPUTS, NMS_SIZES, NMS_TABLE, NMS_THREADED, CONV_SHAPES
    global CONV_GOAL_SHAPES, MM_SIZES, LOOKUP_SIZES, INPUT_SPEC
    SMOKE, TARGET_SCALE = True, 0.05
    os.environ["OPJIT_BENCH_SMOKE"] = "1"
    INPUTS = os.path.join(ROOT, "build", "bench-smoke", "inputs")
    NMS_SIZES, NMS_TABLE, NMS_THREADED = [300], [300], [600]
    CONV_SHAPES = [("3x3 8->8 @8", 8, 8, 3, 8, 1, 1), ("1x1 16->8 @8", 16, 8, 1, 8, 1, 0)]
    CONV_GOAL_SHAPES = {name for name, *_ in CONV_SHAPES}
    MM_SIZES = [32, 64]
    LOOKUP_SIZES = (50,)
    INPUT_SPEC = "smoke " + INPUT_SPEC


# Rows that may lack a value in a smoke run: what this machine does not
# have (a GPU, NVRTC), said in the row.
SMOKE_ABSENT = ("no GPU on this machine", "NVRTC not available")


def smoke_missing(rows):
    """The rows of a smoke run without a value: an anchor that did not
    build or run, a section that failed. [(metric, why)]."""
    bad = []
    for metric, opjit, anchor, ratio, goal, met in rows:
        cells = " ".join(str(c) for c in (opjit, anchor, ratio, met))
        if "n/a" in cells and not any(a in cells for a in SMOKE_ABSENT):
            bad.append((metric, cells))
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="opjit_bench")
    ap.add_argument("--dnnl", default="", help="dnnl_anchor (the oneDNN conv2d anchor), if built")
    ap.add_argument("--threads", default="", help="thread counts, e.g. 1,2 (default 1 and the CPUs)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="3 repetitions (to try the harness)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny inputs, one repetition, no goals, results in build/bench-smoke: "
                         "every anchor must build and every row have a value (exit 1 if not)")
    ap.add_argument("--only", default="",
                    help="comma list: loads,cli,call,nms,conv2d,mm,python,lookup,remote,backward,"
                         "half,torch2,inline")
    ap.add_argument("--torch2", default="",
                    help="the torch 2.x interpreter for the backward and torch2 rows (bench/run "
                         "finds it)")
    ap.add_argument("--merge", action="store_true",
                    help="rerun only the --only sections and keep the others of the existing "
                         "latest.json")
    ap.add_argument("--isa", default="native", choices=["native"] + sorted(ISA_ENV),
                    help="avx2: the conv2d and mm sections with every side capped at AVX2 "
                         "(emulated on a newer CPU), kept as their own sections")
    ap.add_argument("--results", default=RESULTS,
                    help="where latest.md, latest.json and nms.png go (default bench/results)")
    a = ap.parse_args()
    global THREADS
    if a.threads:
        THREADS = sorted({int(x) for x in a.threads.split(",")})
    reps = 1 if a.smoke else 3 if a.quick else a.reps
    if a.smoke:
        smoke_setup()
        if a.results == RESULTS:
            a.results = os.path.join(ROOT, "build", "bench-smoke")
    only = set(a.only.split(",")) if a.only else {"loads", "cli", "call", "nms", "conv2d", "mm",
                                                  "python", "lookup", "remote", "backward", "half",
                                                  "torch2", "inline"}
    exe = os.path.abspath(a.bin)
    out_dir = os.path.abspath(a.results)
    os.chdir(ROOT)
    os.makedirs(out_dir, exist_ok=True)
    gen_inputs()
    t_start = time.time()
    R = {"env": environment(reps), "reps": reps, "reps_load": reps, "nvrtc": nvrtc_available(),
         "ran_loads": "loads" in only,
         "gpu": gpu_present(), "loads": {}}
    tmp = tempfile.mkdtemp(prefix="opjit-bench-")
    try:
        if "loads" in only:
            R["loads"] = bench_loads(exe, reps)
            # Last: removing its entries still costs the disk a moment.
            R["full_cache"] = bench_full_cache_section(exe, reps)
        if "lookup" in only:
            for nsrc in LOOKUP_SIZES:
                log("lookup: an op by name among %d sources" % nsrc)
                R["lookup" if nsrc == 50 else "lookup_%d" % nsrc] = bench_lookup(exe, reps, tmp, nsrc)
        if "cli" in only:
            log("cli: cold opjit load vs cc -O2 -shared, whole processes (%d reps)" % reps)
            R["cli"] = bench_cli_cold(reps, tmp)
            log("cli: instruction counts (callgrind)")
            R["instr"] = bench_instr(tmp)
        if "remote" in only:
            R["remote"] = remote_bench.bench(exe, ROOT, reps, log, parse_rep)
        if "inline" in only:
            log("inline: opjit.load_inline vs cpp_extension and tvm-ffi load_inline, per call")
            R["inline"] = inline_bench.bench(reps, tmp)
        sv = Serve(exe, os.path.join(tmp, "cache"))
        dn = Serve(os.path.abspath(a.dnnl)) if a.dnnl and os.path.exists(a.dnnl) else None
        if not dn:
            log("no oneDNN anchor (%s): conv2d rows against oneDNN are n/a"
                % (a.dnnl or "bench/run did not build it"))
        try:
            R["faults"] = bench_faults(sv)
            if "call" in only:
                try:
                    R["call_overhead"] = bench_call_overhead(sv, reps)
                except BenchError as e:
                    R["call_overhead"] = {"error": str(e)[:200]}
            if "nms" in only:
                R["nms"] = bench_nms(sv, reps)
            if "conv2d" in only:
                R["conv2d" + ISA_SUFFIX] = bench_conv(sv, dn, reps, tmp)
            if "mm" in only:
                R["mm" + ISA_SUFFIX] = bench_mm(sv, dn, reps, tmp)
            if "python" in only:
                for name in ("nms", "mm"):
                    load_op(sv, name)
                R["python"] = py_bench.bench(sv, reps, sys.modules[__name__], tmp)
            if "conv2d" in only and not ISA_SUFFIX:
                R["hosts"] = bench_hosts(sv, reps)
            if "backward" in only:
                R["backward"] = backward_bench.run(a.torch2, THREADS, reps, tmp)
            if "half" in only:
                R["half"] = half_bench.run(a.torch2, THREADS, reps, tmp)
            if "torch2" in only:
                R["torch2"] = bench_torch2(a.torch2, reps)
        finally:
            sv.close()
            if dn:
                dn.close()
        R["elapsed_s"] = time.time() - t_start
        if a.merge:
            R = merged_results(os.path.join(out_dir, "latest.json"), R, only)
        table = build_rows(R)
        missing = smoke_missing(table) if SMOKE else []
        R["table"] = [dict(zip(["metric", "opjit", "anchor", "ratio", "goal", "met"], r))
                      for r in table]
        if not SMOKE:  # one box count: nothing to plot
            plot_nms(R, os.path.join(out_dir, "nms.png"), tmp)
        write_md(R, os.path.join(out_dir, "latest.md"))
        with open(os.path.join(out_dir, "latest.json"), "w") as f:
            json.dump(R, f, indent=1, sort_keys=True, default=str)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log("wrote %s/latest.md, latest.json%s (%.0f s)"
        % (os.path.relpath(out_dir, ROOT), "" if SMOKE else ", nms.png", R["elapsed_s"]))
    if SMOKE:
        for metric, why in missing:
            log("smoke: no value: %s: %s" % (metric, why[:300]))
        log("smoke: %d rows, %s" % (len(R["table"]), "%d without a value" % len(missing)
                                    if missing else "every one with a value"))
        sys.exit(1 if missing else 0)
    print(open(os.path.join(out_dir, "latest.md")).read().split("\n## ")[0])


if __name__ == "__main__":
    main()
