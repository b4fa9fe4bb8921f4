"""bench/half_bench.py - the half rows of bench/run: opjit's conv2d (the
ResNet-50 shapes of the float32 rows) and mm (256 to 2048) in bfloat16 and
float16 on the CPU against torch 2.x in the same dtype, their gradients
(conv2d_backward, mm_backward) against torch's backward, and against opjit's
own float32 on the same values (information), side by side in one process,
interleaved repetition by repetition, at the same thread count (opjit's
runtime threads, torch.set_num_threads).

Run by bench.py (which imports this file for run(), rows() and
md_section()) as a child process of the torch 2.x interpreter (the
development virtual environment), which imports the opjit package built
for it (build/python-extra, on PYTHONPATH). Standalone:

    PYTHONPATH=build/python-extra OPJIT_OPS_PATH=$PWD/ops-src \\
        ~/.cache/opjit-dev/torch2/bin/python bench/half_bench.py --threads 1,2 \\
        [--reps 5] [--only conv,mm,grad] [--out r.json]

opjit runs its optimizing tier: bfloat16 on the AMX GEMM
(ops-src/gemm_half.h) where the CPU has AMX-BF16, else its vdpbf16ps GEMM
where the CPU has AVX512_BF16, else widened to float32; float16 mm on
the float32 GEMM converting while it packs (ops-src/mm.c), float16 conv2d
widened to float32 (ops-src/half_wide.h). torch 2.x's
bfloat16 conv2d and mm go through oneDNN (AVX512_BF16 where the CPU has
it); its float16 ones have no fast CPU kernel on most x86 CPUs and take
seconds on the larger shapes: a torch side whose first call takes more than
SLOW seconds is timed on that one call, not interleaved (said in the row).

Each row also gives the largest error of each side against a float64
reference on the same (16-bit) inputs, relative to the reference's largest
magnitude."""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from torch2_run import calibrate, interleaved, run_script

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

# bench.py's CONV_SHAPES: label, C, O, k, H=W, stride, padding.
CONV_SHAPES = [
    ("3x3 64->64 @56", 64, 64, 3, 56, 1, 1),
    ("1x1 256->64 @56", 256, 64, 1, 56, 1, 0),
    ("1x1 64->256 @56", 64, 256, 1, 56, 1, 0),
    ("3x3 128->128 @28", 128, 128, 3, 28, 1, 1),
    ("1x1 512->2048 @7", 512, 2048, 1, 7, 1, 0),
]
CONV_BATCHES = [1, 8]
MM_SIZES = [256, 512, 1024, 2048]
GRAD_BATCHES = [8]  # the gradients: training batches only
DTYPES = ["bfloat16", "float16"]
SLOW = 0.5  # seconds: a slower torch side is timed on one call
SETTLE = 0.05
SMOKE = os.environ.get("OPJIT_BENCH_SMOKE") == "1"
if SMOKE:
    CONV_SHAPES = [("3x3 8->8 @8", 8, 8, 3, 8, 1, 1), ("1x1 16->8 @8", 16, 8, 1, 8, 1, 0)]
    CONV_BATCHES = [1]
    GRAD_BATCHES = [1]
    MM_SIZES = [32]


def log(msg):
    print("half_bench: " + msg, file=sys.stderr, flush=True)



def rel_err(got, ref):
    """The largest error over the reference's largest magnitude; the worst
    output's for a tuple of outputs (a backward's gradients)."""
    if isinstance(ref, (tuple, list)):
        return max(rel_err(g, r) for g, r in zip(got, ref) if r is not None)
    return float((got.double() - ref).abs().max() / (ref.abs().max() + 1e-30))


def measure(mine, f32, anchor, ref, reps, target, settle):
    """One row's numbers: opjit (16-bit), opjit float32, torch (16-bit)."""
    got, want = mine(), None
    t0 = time.perf_counter()
    want = anchor()
    first = time.perf_counter() - t0
    sides = [("opjit", mine), ("f32", f32)]
    slow = first > SLOW
    if not slow:
        sides.append(("torch", anchor))
    t = interleaved(sides, reps, target, settle)
    med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
    if slow:
        med["torch"] = first * 1e3
        ratio = med["torch"] / med["opjit"]
    else:
        ratio = statistics.median([a / b for a, b in zip(t["torch"], t["opjit"])])
    return {"opjit_ms": med["opjit"], "f32_ms": med["f32"], "torch_ms": med["torch"],
            "ratio": ratio, "vs_f32": med["f32"] / med["opjit"], "torch_one_call": slow,
            "err_opjit": rel_err(got, ref), "err_torch": rel_err(want, ref)}


def bench_conv(torch, ops, threads, reps, target):
    import torch.nn.functional as F
    rows = []
    conv = ops["conv2d"]
    settle = SETTLE if threads > 1 else 0
    for label, c, o, k, hw, stride, pad in CONV_SHAPES:
        for n in CONV_BATCHES:
            g = torch.Generator().manual_seed(hash((label, n)) & 0xFFFF)
            x32 = torch.randn(n, c, hw, hw, generator=g)
            w32 = torch.randn(o, c, k, k, generator=g) * (1.0 / (c * k * k)) ** 0.5
            for dt in DTYPES:
                x, w = x32.to(getattr(torch, dt)), w32.to(getattr(torch, dt))
                xf, wf = x.float(), w.float()
                ref = F.conv2d(x.double(), w.double(), None, stride, pad)
                r = measure(lambda: conv(x, w, None, stride, pad),
                            lambda: conv(xf, wf, None, stride, pad),
                            lambda: F.conv2d(x, w, None, stride, pad), ref, reps, target, settle)
                flops = 2 * n * o * c * k * k * ((hw + 2 * pad - k) // stride + 1) ** 2
                r.update({"label": label, "batch": n, "threads": threads, "dtype": dt,
                          "gflops": flops / r["opjit_ms"] / 1e6})
                rows.append(r)
                log("conv2d %s batch %d %s, %d thread(s): opjit %.3f ms, torch %.3f ms%s, %.2fx;"
                    " opjit float32 %.3f ms" % (label, n, dt, threads, r["opjit_ms"],
                                                r["torch_ms"],
                                                " (one call)" if r["torch_one_call"] else "",
                                                r["ratio"], r["f32_ms"]))
    return rows


def bench_mm(torch, ops, threads, reps, target):
    rows = []
    mm = ops["mm"]
    settle = SETTLE if threads > 1 else 0
    for s in MM_SIZES:
        g = torch.Generator().manual_seed(s)
        a32, b32 = torch.randn(s, s, generator=g), torch.randn(s, s, generator=g)
        for dt in DTYPES:
            a, b = a32.to(getattr(torch, dt)), b32.to(getattr(torch, dt))
            af, bf = a.float(), b.float()
            ref = a.double() @ b.double()
            r = measure(lambda: mm(a, b), lambda: mm(af, bf), lambda: torch.mm(a, b), ref, reps,
                        target, settle)
            r.update({"size": s, "threads": threads, "dtype": dt,
                      "gflops": 2 * s ** 3 / r["opjit_ms"] / 1e6})
            rows.append(r)
            log("mm %d %s, %d thread(s): opjit %.3f ms, torch %.3f ms%s, %.2fx; opjit float32 "
                "%.3f ms" % (s, dt, threads, r["opjit_ms"], r["torch_ms"],
                             " (one call)" if r["torch_one_call"] else "", r["ratio"],
                             r["f32_ms"]))
    return rows


def bench_grad(torch, ops, threads, reps, target):
    """conv2d_backward (grad_input and grad_weight) and mm_backward (both
    products) against torch's backward of the same op in the same dtype."""
    rows = []
    settle = SETTLE if threads > 1 else 0
    conv_bw, mm_bw = ops["conv2d_backward"], ops["mm_backward"]
    aten_bw = torch.ops.aten.convolution_backward
    mask = [True, True, False]
    for label, c, o, k, hw, stride, pad in CONV_SHAPES:
        ho = (hw + 2 * pad - k) // stride + 1
        for n in GRAD_BATCHES:
            g = torch.Generator().manual_seed(hash(("grad", label, n)) & 0xFFFF)
            x32 = torch.randn(n, c, hw, hw, generator=g)
            w32 = torch.randn(o, c, k, k, generator=g) * (1.0 / (c * k * k)) ** 0.5
            dy32 = torch.randn(n, o, ho, ho, generator=g)
            for dt in DTYPES:
                x, w, dy = (t.to(getattr(torch, dt)) for t in (x32, w32, dy32))
                xf, wf, dyf = x.float(), w.float(), dy.float()

                def theirs(dy, x, w):
                    return aten_bw(dy, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False,
                                   [0, 0], 1, mask)[:2]

                def mine(dy, x, w):
                    return conv_bw(dy, x, w, None, stride, pad, 1, 1, mask)[:2]
                ref = theirs(dy.double(), x.double(), w.double())
                r = measure(lambda: mine(dy, x, w), lambda: mine(dyf, xf, wf),
                            lambda: theirs(dy, x, w), ref, reps, target, settle)
                flops = 2 * 2 * n * o * c * k * k * ho * ho
                r.update({"op": "conv2d_backward", "label": "%s, batch %d" % (label, n),
                          "threads": threads, "dtype": dt,
                          "gflops": flops / r["opjit_ms"] / 1e6})
                rows.append(r)
                log("conv2d_backward %s batch %d %s, %d thread(s): opjit %.3f ms, torch %.3f ms"
                    "%s, %.2fx" % (label, n, dt, threads, r["opjit_ms"], r["torch_ms"],
                                   " (one call)" if r["torch_one_call"] else "", r["ratio"]))
    for s in MM_SIZES:
        g = torch.Generator().manual_seed(s + 1)
        a32, b32, g32 = (torch.randn(s, s, generator=g) for _ in range(3))
        for dt in DTYPES:
            a, b, gr = (t.to(getattr(torch, dt)) for t in (a32, b32, g32))
            af, bf, grf = a.float(), b.float(), gr.float()
            ref = (gr.double() @ b.double().t(), a.double().t() @ gr.double())
            r = measure(lambda: mm_bw(gr, a, b), lambda: mm_bw(grf, af, bf),
                        lambda: (gr @ b.t(), a.t() @ gr), ref, reps, target, settle)
            r.update({"op": "mm_backward", "label": "%dx%d" % (s, s), "threads": threads,
                      "dtype": dt, "gflops": 2 * 2 * s ** 3 / r["opjit_ms"] / 1e6})
            rows.append(r)
            log("mm_backward %d %s, %d thread(s): opjit %.3f ms, torch %.3f ms%s, %.2fx"
                % (s, dt, threads, r["opjit_ms"], r["torch_ms"],
                   " (one call)" if r["torch_one_call"] else "", r["ratio"]))
    return rows


def main():
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.1, help="seconds a repetition")
    ap.add_argument("--only", default="conv,mm,grad")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    try:
        import opjit
    except ImportError as e:
        res = {"missing": "the opjit Python package is not built for %s (%s)"
               % (sys.executable, e)}
        json.dump(res, open(a.out, "w") if a.out else sys.stdout)
        return
    cpu = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    res = {"torch": torch.__version__, "python": sys.executable,
           "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "avx512_bf16": " avx512_bf16" in cpu, "f16c": " f16c" in cpu,
           "amx_bf16": " amx_bf16" in cpu,
           "half_kernel": os.environ.get("OPJIT_HALF_KERNEL", "auto") or "auto",
           "conv": [], "mm": [], "grad": []}
    only = set(a.only.split(","))
    with tempfile.TemporaryDirectory(prefix="opjit-half-bench-") as cache:
        for threads in sorted({int(x) for x in a.threads.split(",")}):
            torch.set_num_threads(threads)
            os.environ["OPJIT_NUM_THREADS"] = str(threads)
            rt = opjit.Runtime(ops_path=os.path.join(ROOT, "ops-src"), cache_dir=cache,
                               tiering=True)
            ops = {name: rt.load_op(name)
                   for name in ("conv2d", "mm", "conv2d_backward", "mm_backward")}
            rt.wait()
            res["tier"] = ops["mm"].tier
            if "conv" in only:
                res["conv"] += bench_conv(torch, ops, threads, a.reps, a.target)
            if "mm" in only:
                res["mm"] += bench_mm(torch, ops, threads, a.reps, a.target)
            if "grad" in only:
                res["grad"] += bench_grad(torch, ops, threads, a.reps, a.target)
            del ops, rt
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    else:
        json.dump(res, sys.stdout, indent=1)


# ---- for bench.py (run by Debian's python3) ------------------------------------

def run(python, threads, reps, tmp):
    """This file under python (the torch 2.x interpreter) at these thread
    counts: its results, or {"missing": why}."""
    return run_script(__file__, python, threads, reps, tmp,
                      "conv2d, mm and their gradients in bfloat16 and float16", log)


def rows(H, fms, yesno, thr):
    """bench.py's summary rows: (metric, opjit, anchor, ratio, goal, met)."""
    if not H:
        return []
    if "missing" in H:
        return [("conv2d / mm CPU bfloat16 and float16 against torch 2.x", "n/a", "n/a", "n/a",
                 ">= 1.0x throughput", H["missing"])]
    out = []
    tv = H.get("torch", "?").split("+")[0]

    def one(what, r):
        anchor = "torch %s %s: %s%s" % (tv, r["dtype"], fms(r["torch_ms"]),
                                        " (one call)" if r["torch_one_call"] else "")
        out.append(("%s, %s (%s tier)" % (what, thr(r["threads"]), H.get("tier", "?")),
                    fms(r["opjit_ms"]), anchor, "%.2fx throughput" % r["ratio"],
                    ">= 1.0x throughput", yesno(r["ratio"] >= 1.0)))
    for r in H["conv"]:
        one("conv2d CPU %s %s, batch %d" % (r["dtype"], r["label"], r["batch"]), r)
    for r in H["mm"]:
        one("mm CPU %s %dx%d" % (r["dtype"], r["size"], r["size"]), r)
    for r in H.get("grad", []):
        one("%s CPU %s %s" % (r["op"], r["dtype"], r["label"]), r)
    return out


def md_section(H, fms, md_table):
    """The half section of latest.md."""
    if not H or "missing" in H:
        return []
    lines = ["## Half precision on the CPU: conv2d and mm in bfloat16 and float16 against "
             "torch %s" % H.get("torch", "?"), "",
             "One process of torch %s's interpreter (CPU capability %s; this CPU %s AVX512_BF16, "
             "%s AMX-BF16, %s F16C), interleaved, the same threads on both sides; opjit's %s tier "
             "($OPJIT_HALF_KERNEL %s: bfloat16 on the AMX GEMM of ops-src/gemm_half.h where the "
             "CPU has it, else its vdpbf16ps GEMM where the CPU has that; float16 mm on the "
             "float32 GEMM converting while it packs, float16 conv2d widened to "
             "float32). \"vs float32\": opjit's own "
             "float32 op on the same values, time over the 16-bit one (information). Errors: "
             "the largest against a float64 reference on the same 16-bit inputs, over the "
             "reference's largest magnitude. torch's float16 CPU kernels are slow: a torch side "
             "slower than %.1f s a call is timed on one call (marked *)." % (
                 H.get("torch", "?"), H.get("cpu_capability", "?"),
                 "has" if H.get("avx512_bf16") else "lacks",
                 "has" if H.get("amx_bf16") else "lacks",
                 "has" if H.get("f16c") else "lacks", H.get("tier", "?"),
                 H.get("half_kernel", "auto"), SLOW), ""]

    def cells(r):
        return (r["threads"], fms(r["opjit_ms"]),
                fms(r["torch_ms"]) + ("*" if r["torch_one_call"] else ""),
                "%.2fx" % r["ratio"], fms(r["f32_ms"]), "%.2fx" % r["vs_f32"],
                "%.0f" % r["gflops"], "%.1e / %.1e" % (r["err_opjit"], r["err_torch"]))
    head = ["threads", "opjit", "torch", "throughput vs torch", "opjit float32",
            "vs float32", "GFLOP/s", "error opjit / torch"]
    lines.append(md_table(["conv2d", "dtype", "batch"] + head,
                          [(r["label"], r["dtype"], r["batch"]) + cells(r) for r in H["conv"]]))
    lines.append("")
    lines.append(md_table(["mm n", "dtype"] + head,
                          [(r["size"], r["dtype"]) + cells(r) for r in H["mm"]]))
    lines.append("")
    if H.get("grad"):
        lines += ["The gradients: opjit's conv2d_backward (grad_input and grad_weight) and "
                  "mm_backward (both products) against torch's backward of the same op "
                  "(aten.convolution_backward; `g @ b.t()`, `a.t() @ g`) in the same dtype; "
                  "errors are the worse of the two gradients'.", ""]
        lines.append(md_table(["gradient", "dtype"] + head,
                              [("%s %s" % (r["op"], r["label"]), r["dtype"]) + cells(r)
                               for r in H["grad"]]))
        lines.append("")
    return lines


if __name__ == "__main__":
    main()
