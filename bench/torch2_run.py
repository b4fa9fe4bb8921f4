"""bench/torch2_run.py - what the benches run under torch 2.x share
(backward_bench.py, half_bench.py, torch2_bench.py): timing interleaved
repetitions, and running such a bench from bench.py (Debian's python3)
under the torch 2.x interpreter. Imports nothing but the standard library.
"""
import json
import os
import subprocess
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def calibrate(fn, target, cap=1 << 16):
    """Calls a repetition makes to last about target seconds (fn warmed up
    once first)."""
    fn()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t0
        if t >= target or n >= cap:
            return n
        n = max(n * 2, int(n * target / max(t, 1e-6)))


def interleaved(sides, reps, target, settle):
    """sides: [(name, fn)]. reps rounds, each timing one repetition of every
    side, the order rotating from round to round. {name: [s per call]}."""
    iters = {name: calibrate(fn, target) for name, fn in sides}
    out = {name: [] for name, _ in sides}
    for r in range(reps):
        for name, fn in sides[r % len(sides):] + sides[:r % len(sides)]:
            n = iters[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            out[name].append((time.perf_counter() - t0) / n)
            if settle:
                time.sleep(settle)
    return out


def run_script(script, python, threads, reps, tmp, what, log):
    """script (a bench file) under python, the torch 2.x interpreter, at
    these thread counts: its results, or {"missing": why}. The package
    built for that interpreter is found through $OPJIT_BENCH_TORCH2_PATH."""
    name = os.path.splitext(os.path.basename(script))[0]
    if not python or not os.path.exists(python):
        return {"missing": "no torch 2.x interpreter (%s; the deps script makes the virtual "
                           "environment, $OPJIT_TORCH2_PYTHON names another)" % (python or "none")}
    out = os.path.join(tmp, name + ".json")
    env = dict(os.environ)
    if env.get("OPJIT_BENCH_TORCH2_PATH"):
        env["PYTHONPATH"] = env["OPJIT_BENCH_TORCH2_PATH"]
    args = [python, os.path.abspath(script), "--threads", ",".join(map(str, threads)),
            "--reps", str(reps), "--out", out] + (
                ["--target", "0.01"] if os.environ.get("OPJIT_BENCH_SMOKE") == "1" else [])
    log("%s against torch 2.x (%s)" % (what, python))
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=3600, env=env)
    if p.returncode != 0 or not os.path.exists(out):
        return {"missing": "%s.py failed: %s" % (name, p.stderr.strip()[-300:] or p.returncode)}
    with open(out) as f:
        return json.load(f)
