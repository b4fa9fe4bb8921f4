"""bench/py_bench.py - the Python package's rows of bench/run (bench.py
imports it): per-call cost of opjit ops called from Python against the same
call made from C and against the torch operator, and the cold and cached
opjit.load_op("nms") in a fresh interpreter against
torch.utils.cpp_extension.load_inline of an equivalent C++ nms.

The package is the one built in build/python (bench/run builds it and puts
it on PYTHONPATH).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torchvision

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PY = sys.executable
TINY_BOXES = 8
TINY_MM = 4
CALL_GOAL_US = 2.5  # opjit from Python within this of the same call from C


def log(msg):
    print("bench: " + msg, file=sys.stderr, flush=True)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def gen_tiny_inputs(inp):
    """The tiny inputs, as .npy files both sides read (same rule as nms's)."""
    rng = np.random.default_rng([5, TINY_BOXES])
    xy = rng.uniform(0, 1000, size=(TINY_BOXES, 2))
    wh = rng.uniform(10, 110, size=(TINY_BOXES, 2))
    np.save(inp("boxes_tiny"), np.concatenate([xy, xy + wh], axis=1).astype(np.float32))
    np.save(inp("scores_tiny"), rng.uniform(0, 1, size=TINY_BOXES).astype(np.float32))
    rng = np.random.default_rng([6, TINY_MM])
    np.save(inp("mm_a_tiny"), rng.standard_normal((TINY_MM, TINY_MM), dtype=np.float32))
    np.save(inp("mm_b_tiny"), rng.standard_normal((TINY_MM, TINY_MM), dtype=np.float32))


# ---- per call ------------------------------------------------------------------

def bench_calls(sv, reps, h, tmp):
    """h: bench.py's helpers (interleaved, torch_timer, opjit_timer, inp,
    torch_input). sv: the C coprocess, its ops already loaded (opt tier)."""
    try:
        import opjit
    except ImportError as e:
        return {"missing": "the opjit Python package is not built (%s)" % e}
    rt = opjit.Runtime(ops_path=os.path.join(ROOT, "ops-src"),
                       cache_dir=os.path.join(tmp, "py-cache"), tiering=True)
    nms, mm = rt.load_op("nms"), rt.load_op("mm")
    rt.wait()  # the optimized tier, as the C side's "opt" runtime
    res = {"tiers": {"nms": nms.tier, "mm": mm.tier}, "opjit_version": opjit.__version__}
    for name in ("boxes_tiny", "scores_tiny", "mm_a_tiny", "mm_b_tiny"):
        sv.cmd("input", name, h.inp(name))
    bt, st = h.torch_input("boxes_tiny"), h.torch_input("scores_tiny")
    at, bmt = h.torch_input("mm_a_tiny"), h.torch_input("mm_b_tiny")
    bn, sn, an, bmn = bt.numpy(), st.numpy(), at.numpy(), bmt.numpy()
    same = (torch.equal(nms(bt, st, 0.5), torchvision.ops.nms(bt, st, 0.5)) and
            np.array_equal(nms(bn, sn, 0.5), torchvision.ops.nms(bt, st, 0.5).numpy()) and
            torch.allclose(mm(at, bmt), torch.mm(at, bmt), rtol=1e-5, atol=1e-6))
    res["same_results"] = bool(same)
    for op_name, sides in (
            ("nms", [("c", h.opjit_timer(sv, "nms", "opt", "boxes_tiny", "scores_tiny", 0.5)),
                     ("py_torch", h.torch_timer(lambda: nms(bt, st, 0.5))),
                     ("py_numpy", h.torch_timer(lambda: nms(bn, sn, 0.5))),
                     ("anchor", h.torch_timer(lambda: torchvision.ops.nms(bt, st, 0.5)))]),
            ("mm", [("c", h.opjit_timer(sv, "mm", "opt", "mm_a_tiny", "mm_b_tiny")),
                    ("py_torch", h.torch_timer(lambda: mm(at, bmt))),
                    ("py_numpy", h.torch_timer(lambda: mm(an, bmn))),
                    ("anchor", h.torch_timer(lambda: torch.mm(at, bmt)))])):
        log("python per call: %s" % op_name)
        # Cheap rounds (0.1 s each): many of them, as the differences are small.
        t, iters = h.interleaved(sides, max(15, 2 * reps), 0.1)
        row = {"iters": iters}
        for k, v in t.items():
            row[k + "_us"] = median(v["wall"]) * 1e6
            row[k + "_us_all"] = [x * 1e6 for x in v["wall"]]
        for fw in ("py_torch", "py_numpy"):
            for kind, suf in (("wall", ""), ("cpu", "_cpu")):
                row[fw + "_over_c%s_us" % suf] = median([(a - b) * 1e6 for a, b in
                                                          zip(t[fw][kind], t["c"][kind])])
            row[fw + "_over_anchor"] = median([a / b for a, b in
                                               zip(t[fw]["wall"], t["anchor"]["wall"])])
        res[op_name] = row
    return res


# ---- loads in fresh interpreters ----------------------------------------------------

OPJIT_LOAD = r"""
import json, time
t0 = time.perf_counter()
import opjit
t1 = time.perf_counter()
op = opjit.load_op("nms")
t2 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "load_ms": (t2 - t1) * 1e3, "tier": op.tier}))
"""

IMPORT_BUILT = r"""
import importlib.util, json, sys, time
import torch
t0 = time.perf_counter()
spec = importlib.util.spec_from_file_location("opjit_bench_nms", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
t1 = time.perf_counter()
print(json.dumps({"load_ms": (t1 - t0) * 1e3}))
"""

LOAD_INLINE = r"""
import json, sys, time
import torch, torchvision
from torch.utils.cpp_extension import load_inline
src = open(sys.argv[1]).read()
t0 = time.perf_counter()
mod = load_inline(name="opjit_bench_nms", cpp_sources=[src], functions=["nms"],
                  build_directory=sys.argv[2], extra_cflags=["-O2"], verbose=False)
t1 = time.perf_counter()
g = torch.Generator().manual_seed(0)
b = torch.rand(500, 4, generator=g) * 100
b[:, 2:] += b[:, :2]
s = torch.rand(500, generator=g)
same = torch.equal(mod.nms(b, s, 0.5), torchvision.ops.nms(b, s, 0.5))
print(json.dumps({"load_ms": (t1 - t0) * 1e3, "same": bool(same)}))
"""


def run_py(script, args, env):
    t0 = time.perf_counter()
    p = subprocess.run([PY, "-c", script] + args, capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=1800)
    wall = (time.perf_counter() - t0) * 1e3
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip()[-400:])
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["wall_ms"] = wall
    return out


def bench_loads(reps, tmp):
    env = dict(os.environ, OPJIT_OPS_PATH=os.path.join(ROOT, "ops-src"), OPJIT_TIERING="0")
    res = {"cold": [], "hit": []}
    try:
        for r in range(reps + 1):  # the first warms the page cache: dropped
            cache = tempfile.mkdtemp(prefix="py-cold-", dir=tmp)
            e = dict(env, OPJIT_CACHE_DIR=cache)
            cold, hit = run_py(OPJIT_LOAD, [], e), run_py(OPJIT_LOAD, [], e)
            if r:
                res["cold"].append(cold)
                res["hit"].append(hit)
    except (RuntimeError, ValueError) as e:
        return {"error": "opjit.load_op in a fresh interpreter: %s" % e}
    for k in ("cold", "hit"):
        for f in ("load_ms", "import_ms", "wall_ms"):
            res["%s_%s" % (k, f)] = median([x[f] for x in res[k]])
    res["tier"] = res["cold"][0]["tier"]
    # The anchor, cold once (tens of seconds: g++ on torch/extension.h); then
    # load_inline again in a fresh process (torch 1.13 rewrites main.cpp, so
    # ninja builds again), and an import of the built module (what a hit
    # would cost).
    build = tempfile.mkdtemp(prefix="load-inline-", dir=tmp)
    src = os.path.join(ROOT, "bench", "nms_inline.cpp")
    log("python loads: load_inline of bench/nms_inline.cpp, cold (g++ + ninja: tens of seconds)")
    try:
        res["inline_cold"] = run_py(LOAD_INLINE, [src, build], dict(os.environ))
        if os.environ.get("OPJIT_BENCH_SMOKE") != "1":  # another whole g++ build
            log("python loads: load_inline again, fresh process")
            res["inline_again"] = run_py(LOAD_INLINE, [src, build], dict(os.environ))
        so = os.path.join(build, "opjit_bench_nms.so")
        res["inline_import"] = [run_py(IMPORT_BUILT, [so], dict(os.environ)) for _ in range(3)]
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        res["inline_error"] = str(e)[-300:]
        return res
    res["inline_cold_ms"] = res["inline_cold"]["load_ms"]
    res["inline_again_ms"] = res["inline_again"]["load_ms"] if "inline_again" in res else None
    res["inline_hit_ms"] = median([x["load_ms"] for x in res["inline_import"]])
    res["inline_same"] = res["inline_cold"]["same"]
    res["cold_ratio"] = res["inline_cold_ms"] / res["cold_load_ms"]
    return res


def bench(sv, reps, h, tmp):
    out = {"calls": bench_calls(sv, reps, h, tmp)}
    if "missing" in out["calls"]:
        return out
    log("python loads: opjit.load_op(\"nms\") in fresh interpreters (%d reps)" % reps)
    out["loads"] = bench_loads(reps, tmp)
    return out


# ---- report ---------------------------------------------------------------------------

def us(x):
    return "%.2f µs" % x


def yesno(b):
    return "yes" if b else "**no**"


def rows(P, fms):
    """Rows of the summary table: (metric, opjit, anchor, ratio, goal, met)."""
    out = []
    C = P.get("calls", {})
    if "missing" in C or not C:
        return [("opjit from Python", "n/a", "n/a", "n/a", "-", C.get("missing", "not run"))]
    for op_name, what, anchor in (("nms", "nms on %d boxes" % TINY_BOXES, "torchvision.ops.nms"),
                                  ("mm", "mm %dx%d float32" % (TINY_MM, TINY_MM), "torch.mm")):
        r = C[op_name]
        for fw, label in (("py_torch", "torch in/out"), ("py_numpy", "numpy in/out")):
            over = r[fw + "_over_c_us"]
            out.append(("per call from Python, %s, %s (opt tier)" % (what, label),
                        us(r[fw + "_us"]), "the same opjit_call from C: " + us(r["c_us"]),
                        "+%.2f µs" % over, "<= +%.1f µs" % CALL_GOAL_US,
                        yesno(over <= CALL_GOAL_US)))
            ratio = r[fw + "_over_anchor"]
            out.append(("  same, against %s (torch tensors, from Python)" % anchor,
                        us(r[fw + "_us"]), "%s: %s" % (anchor, us(r["anchor_us"])),
                        "%.2fx time" % ratio, "<= 1.0x time", yesno(ratio <= 1.0)))
    L = P.get("loads", {})
    if "error" in L:
        out.append(("cold opjit.load_op(\"nms\"), fresh interpreter", "n/a", "n/a", "n/a",
                    ">= 100x faster", "n/a (%s)" % L["error"][:150]))
    elif L:
        if "cold_ratio" in L:
            out.append(("cold opjit.load_op(\"nms\") in a fresh interpreter, empty cache (libtcc)",
                        fms(L["cold_load_ms"]),
                        "torch.utils.cpp_extension.load_inline of the same nms in C++ (g++, ninja): "
                        + fms(L["inline_cold_ms"]),
                        "%.0fx faster" % L["cold_ratio"], ">= 100x faster",
                        yesno(L["cold_ratio"] >= 100)))
        else:
            out.append(("cold opjit.load_op(\"nms\") in a fresh interpreter, empty cache",
                        fms(L["cold_load_ms"]), "load_inline: n/a (%s)" % L.get("inline_error", "?")[:120],
                        "n/a", ">= 100x faster", "n/a"))
        out.append(("  cache hit, fresh interpreter (opjit.load_op(\"nms\"); import opjit: %s more)"
                    % fms(L["hit_import_ms"]),
                    fms(L["hit_load_ms"]),
                    "import of the module load_inline built: " + fms(L.get("inline_hit_ms")),
                    "%.1fx time" % (L["hit_load_ms"] / L["inline_hit_ms"])
                    if L.get("inline_hit_ms") else "n/a", "report", "-"))
    return out


def md_section(P, fms):
    C, L = P.get("calls", {}), P.get("loads", {})
    if not C or "missing" in C:
        return []
    lines = ["## Python: per call and loads", ""]
    lines.append("Tiers serving the Python side: nms %s, mm %s; results equal to torchvision / "
                 "torch.mm: %s." % (C["tiers"]["nms"], C["tiers"]["mm"], yesno(C["same_results"])))
    lines.append("")
    lines.append("| op, tiny input | from C (opjit_call) | Python, torch | Python, numpy | "
                 "torch operator | Python torch − C (CPU time) | Python numpy − C (CPU time) |")
    lines.append("|---|---|---|---|---|---|---|")
    for op_name, label in (("nms", "nms, %d boxes" % TINY_BOXES),
                           ("mm", "mm %dx%d" % (TINY_MM, TINY_MM))):
        r = C[op_name]
        lines.append("| %s | %s | %s | %s | %s | +%.2f µs (+%.2f µs) | +%.2f µs (+%.2f µs) |" % (
            label, us(r["c_us"]), us(r["py_torch_us"]), us(r["py_numpy_us"]),
            us(r["anchor_us"]), r["py_torch_over_c_us"], r["py_torch_over_c_cpu_us"],
            r["py_numpy_over_c_us"], r["py_numpy_over_c_cpu_us"]))
    lines.append("")
    if L and "error" not in L:
        lines.append("| load of nms in a fresh interpreter | opjit.load_op | import opjit | "
                     "process wall | load_inline |")
        lines.append("|---|---|---|---|---|")
        lines.append("| cold (empty cache / build directory) | %s | %s | %s | %s |" % (
            fms(L["cold_load_ms"]), fms(L["cold_import_ms"]), fms(L["cold_wall_ms"]),
            fms(L.get("inline_cold_ms"))))
        lines.append("| again (opjit: cache hit) | %s | %s | %s | %s (builds again: torch 1.13 "
                     "rewrites main.cpp in every process) |" % (
                         fms(L["hit_load_ms"]), fms(L["hit_import_ms"]), fms(L["hit_wall_ms"]),
                         fms(L.get("inline_again_ms"))))
        lines.append("| importing the module load_inline built | | | | %s |"
                     % fms(L.get("inline_hit_ms")))
        lines.append("")
        if "inline_same" in L:
            lines.append("The load_inline nms gives torchvision's indices on 500 random boxes: %s."
                         % yesno(L["inline_same"]))
            lines.append("")
    lines.append(
        "Why torch in/out costs more than numpy: a torch tensor crosses as "
        "`torch._C._to_dlpack` per input and `torch._C._from_dlpack` per output (torch's own "
        "DLPack export and import, about 0.4-0.6 µs each on this machine); numpy's "
        "`__dlpack__` is a C method, and `numpy.from_dlpack` takes the output.")
    lines.append("")
    return lines


HOW = """- **Python per call**: the package built in build/python, in the bench driver process,
  one runtime with tiering on after `wait()` (the opt tier, as the C side's). nms on 8 random
  boxes (`boxes_tiny.npy`, same rule as the nms inputs) at IoU 0.5 and mm 4x4 float32: opjit
  called from Python on torch tensors (torch out) and on numpy arrays (numpy out), the same
  `opjit_call` from C in the coprocess on the same .npy inputs (each call followed by the
  output's deleter, as Python frees it), and `torchvision.ops.nms` / `torch.mm` on the torch
  tensors. Interleaved rounds of about 0.1 s per side; the differences and ratios are medians
  over rounds of the within-round values. The Python side times a loop calling a lambda,
  as the torch anchor does.
- **Python loads**: `/usr/bin/python3 -c` in a fresh process with an empty `OPJIT_CACHE_DIR`
  and `OPJIT_TIERING=0` times `opjit.load_op("nms")` (default runtime creation, libtcc compile,
  cache publish, load) and, separately, `import opjit`; then a second fresh process on the same
  cache (the hit). First of N+1 repetitions dropped; medians. The anchor is
  `torch.utils.cpp_extension.load_inline` of `bench/nms_inline.cpp` (a C++ nms with
  torchvision's semantics) into an empty build directory, timed around the call in a fresh
  interpreter that already imported torch: g++ and ninja, run once; then load_inline once more
  in a fresh process (torch 1.13 writes main.cpp again, so ninja rebuilds), and three fresh
  processes importing the built module with importlib (what a cache hit would cost).
"""
