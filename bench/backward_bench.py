"""bench/backward_bench.py - the backward rows of bench/run: opjit's
conv2d_backward (grad_input + grad_weight) and mm_backward (both operands)
on the CPU against torch 2.x's own backward kernels, side by side in one
process, interleaved repetition by repetition, at the same thread count
(opjit's runtime threads, torch.set_num_threads).

Run by bench.py (which imports this file for run(), rows() and
md_section()) as a child process of the torch 2.x interpreter (the
development virtual environment: torch from the package index, the users'
torch), which imports the opjit package built in build/python (on
PYTHONPATH). Standalone:

    PYTHONPATH=build/python ~/.cache/opjit-dev/torch2/bin/python \\
        bench/backward_bench.py --threads 1,2 --reps 7 [--only conv|mm] [--out r.json]

The anchors are what torch's autograd runs for these ops:
aten.convolution_backward with output_mask [True, True, False] (oneDNN on
x86 for float32), and for mm the two products of its derivative formula,
grad.mm(mat2.t()) and self.t().mm(grad) (MKL's sgemm).

Also, for information: what the copy of a strided operand costs (conv2d on
a channels_last input against the same input contiguous)."""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from torch2_run import calibrate, interleaved, run_script

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

# The forward conv2d rows' ResNet-50 shapes (bench.py's CONV_SHAPES):
# label, C, O, k, H=W, stride, padding.
CONV_SHAPES = [
    ("3x3 64->64 @56", 64, 64, 3, 56, 1, 1),
    ("1x1 256->64 @56", 256, 64, 1, 56, 1, 0),
    ("1x1 64->256 @56", 64, 256, 1, 56, 1, 0),
    ("3x3 128->128 @28", 128, 128, 3, 28, 1, 1),
    ("1x1 512->2048 @7", 512, 2048, 1, 7, 1, 0),
]
CONV_GOAL_SHAPES = {"3x3 64->64 @56", "1x1 256->64 @56", "1x1 64->256 @56"}
CONV_BATCHES = [1, 8]
MM_SIZES = [256, 512, 1024, 2048]
SETTLE = 0.05  # after each timed repetition with threads: OpenMP spins a while
# bench/run --smoke: tiny shapes (the same code paths), a short target.
SMOKE = os.environ.get("OPJIT_BENCH_SMOKE") == "1"
if SMOKE:
    CONV_SHAPES = [("3x3 8->8 @8", 8, 8, 3, 8, 1, 1), ("1x1 16->8 @8", 16, 8, 1, 8, 1, 0),
                   ("1x1 8->16 @8", 8, 16, 1, 8, 1, 0)]
    CONV_GOAL_SHAPES = {name for name, *_ in CONV_SHAPES}
    MM_SIZES = [32]


def log(msg):
    print("backward_bench: " + msg, file=sys.stderr, flush=True)



def new_torch():
    import torch
    return torch


def rel_err(got, want):
    return max(float((g - w).abs().max() / (w.abs().max() + 1e-30)) for g, w in zip(got, want))


def new_runtime(threads, cache):
    """An opjit runtime of `threads` threads serving the optimizing tier."""
    import opjit
    os.environ["OPJIT_NUM_THREADS"] = str(threads)
    rt = opjit.Runtime(ops_path=os.path.join(ROOT, "ops-src"), cache_dir=cache, tiering=True)
    ops = {name: rt.load_op(name) for name in ("conv2d_backward", "mm_backward", "conv2d")}
    rt.wait()
    return rt, ops


def bench_conv(ops, threads, reps, target):
    torch = new_torch()
    rows = []
    conv_bw = ops["conv2d_backward"]
    for label, c, o, k, hw, stride, pad in CONV_SHAPES:
        for n in CONV_BATCHES:
            g = torch.Generator().manual_seed(hash((label, n)) & 0xFFFF)
            x = torch.randn(n, c, hw, hw, generator=g)
            w = torch.randn(o, c, k, k, generator=g) * (1.0 / (c * k * k)) ** 0.5
            ho = (hw + 2 * pad - k) // stride + 1
            gy = torch.randn(n, o, ho, ho, generator=g)

            def anchor():
                return torch.ops.aten.convolution_backward(
                    gy, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1,
                    [True, True, False])[:2]

            def mine():
                return conv_bw(gy, x, w, None, stride, pad, 1, 1, [1, 1, 0])[:2]
            err = rel_err(mine(), anchor())
            t = interleaved([("opjit", mine), ("torch", anchor)], reps, target,
                            SETTLE if threads > 1 else 0)
            o_ms, t_ms = statistics.median(t["opjit"]) * 1e3, statistics.median(t["torch"]) * 1e3
            ratio = statistics.median([a / b for a, b in zip(t["torch"], t["opjit"])])
            flops = 2 * 2 * n * o * c * k * k * ho * ho  # two products of the forward's size
            rows.append({"label": label, "batch": n, "threads": threads, "opjit_ms": o_ms,
                         "torch_ms": t_ms, "ratio": ratio, "gflops": flops / o_ms / 1e6,
                         "rel_err": err, "goal": label in CONV_GOAL_SHAPES})
            log("conv2d_backward %s batch %d, %d thread(s): opjit %.3f ms, torch %.3f ms, %.2fx"
                % (label, n, threads, o_ms, t_ms, ratio))
    return rows


def bench_mm(ops, threads, reps, target):
    torch = new_torch()
    rows = []
    mm_bw = ops["mm_backward"]
    for s in MM_SIZES:
        g = torch.Generator().manual_seed(s)
        a, b, gy = (torch.randn(s, s, generator=g) for _ in range(3))

        def anchor():
            return gy.mm(b.t()), a.t().mm(gy)

        def mine():
            return mm_bw(gy, a, b)
        err = rel_err(mine(), anchor())
        t = interleaved([("opjit", mine), ("torch", anchor)], reps, target,
                        SETTLE if threads > 1 else 0)
        o_ms, t_ms = statistics.median(t["opjit"]) * 1e3, statistics.median(t["torch"]) * 1e3
        ratio = statistics.median([a_ / b_ for a_, b_ in zip(t["torch"], t["opjit"])])
        rows.append({"size": s, "threads": threads, "opjit_ms": o_ms, "torch_ms": t_ms,
                     "ratio": ratio, "gflops": 4 * s ** 3 / o_ms / 1e6, "rel_err": err})
        log("mm_backward %dx%d, %d thread(s): opjit %.3f ms, torch %.3f ms, %.2fx"
            % (s, s, threads, o_ms, t_ms, ratio))
    return rows


def bench_strided(ops, threads, reps, target):
    """conv2d forward on a channels_last input (copied to NCHW first) and on
    the same input contiguous, and the copy's share."""
    torch = new_torch()
    rows = []
    conv = ops["conv2d"]
    for label, c, o, k, hw, stride, pad in CONV_SHAPES[:3]:
        x = torch.randn(8, c, hw, hw)
        w = torch.randn(o, c, k, k) * (1.0 / (c * k * k)) ** 0.5
        xl = x.to(memory_format=torch.channels_last)
        t = interleaved([("contiguous", lambda: conv(x, w, None, stride, pad)),
                         ("channels_last", lambda: conv(xl, w, None, stride, pad))], reps, target,
                        SETTLE if threads > 1 else 0)
        a, b = statistics.median(t["contiguous"]) * 1e3, statistics.median(t["channels_last"]) * 1e3
        rows.append({"label": label, "batch": 8, "threads": threads, "contiguous_ms": a,
                     "channels_last_ms": b, "copy_share": (b - a) / b})
        log("conv2d %s batch 8 channels_last, %d thread(s): %.3f ms, contiguous %.3f ms"
            % (label, threads, b, a))
    return rows


def main():
    torch = new_torch()
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--target", type=float, default=0.2, help="seconds a repetition")
    ap.add_argument("--only", default="conv,mm,strided")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    try:
        import opjit  # noqa: F401
    except ImportError as e:
        res = {"missing": "the opjit Python package is not built for %s (%s)"
               % (sys.executable, e)}
        json.dump(res, open(a.out, "w") if a.out else sys.stdout)
        return
    res = {"torch": torch.__version__, "python": sys.executable,
           "mkldnn": torch.backends.mkldnn.is_available(),
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "conv": [], "mm": [],
           "strided": []}
    only = set(a.only.split(","))
    with tempfile.TemporaryDirectory(prefix="opjit-bw-bench-") as cache:
        for threads in sorted({int(x) for x in a.threads.split(",")}):
            torch.set_num_threads(threads)
            rt, ops = new_runtime(threads, cache)
            res["tier"] = ops["conv2d_backward"].tier
            if "conv" in only:
                res["conv"] += bench_conv(ops, threads, a.reps, a.target)
            if "mm" in only:
                res["mm"] += bench_mm(ops, threads, a.reps, a.target)
            if "strided" in only:
                res["strided"] += bench_strided(ops, threads, a.reps, a.target)
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
    return run_script(__file__, python, threads, reps, tmp, "conv2d_backward and mm_backward", log)


def rows(B, fms, yesno, thr):
    """bench.py's summary rows: (metric, opjit, anchor, ratio, goal, met)."""
    if not B:
        return []
    if "missing" in B:
        return [("conv2d / mm backward CPU against torch 2.x", "n/a", "n/a", "n/a",
                 ">= 1.0x / >= 0.97x throughput", B["missing"])]
    out = []
    tv = B.get("torch", "?").split("+")[0]
    for r in B["conv"]:
        goal = ">= 1.0x throughput" if r["goal"] else "report"
        out.append(("conv2d backward CPU (grad_input + grad_weight) %s, batch %d, %s (%s tier)%s"
                     % (r["label"], r["batch"], thr(r["threads"]), B.get("tier", "?"),
                        "" if r["goal"] else " (information)"),
                     fms(r["opjit_ms"]), "torch %s aten.convolution_backward: %s"
                     % (tv, fms(r["torch_ms"])), "%.2fx throughput" % r["ratio"], goal,
                     yesno(r["ratio"] >= 1.0) if r["goal"] else "-"))
    for r in B["mm"]:
        out.append(("mm backward CPU %dx%d float32 (both gradients), %s (%s tier)"
                    % (r["size"], r["size"], thr(r["threads"]), B.get("tier", "?")),
                    fms(r["opjit_ms"]), "torch %s grad.mm(mat2.t()) + self.t().mm(grad): %s"
                    % (tv, fms(r["torch_ms"])), "%.3fx throughput" % r["ratio"],
                    ">= 0.97x throughput", yesno(r["ratio"] >= 0.97)))
    return out


def md_section(B, fms, md_table):
    """The backward section of latest.md."""
    if not B or "missing" in B:
        return []
    lines = ["## Backward: conv2d_backward and mm_backward against torch %s" % B.get("torch", "?"),
             "",
             "Both in one process of torch %s's interpreter (oneDNN %s, CPU capability %s), "
             "interleaved, the same threads on both sides; opjit's %s tier. conv2d: grad_input + "
             "grad_weight (output_mask 1, 1, 0) against aten.convolution_backward; mm: both "
             "gradients against the two products of torch's formula." % (
                 B.get("torch", "?"), "on" if B.get("mkldnn") else "off",
                 B.get("cpu_capability", "?"), B.get("tier", "?")), ""]
    lines.append(md_table(["shape", "batch", "threads", "opjit", "torch", "throughput vs torch",
                           "GFLOP/s opjit", "max rel. error"],
                          [(r["label"] + ("" if r["goal"] else " (information)"), r["batch"],
                            r["threads"], fms(r["opjit_ms"]), fms(r["torch_ms"]),
                            "%.2fx" % r["ratio"], "%.0f" % r["gflops"], "%.1e" % r["rel_err"])
                           for r in B["conv"]]))
    lines.append("")
    lines.append(md_table(["mm n", "threads", "opjit", "torch", "throughput vs torch",
                           "GFLOP/s opjit", "max rel. error"],
                          [(r["size"], r["threads"], fms(r["opjit_ms"]), fms(r["torch_ms"]),
                            "%.3fx" % r["ratio"], "%.0f" % r["gflops"], "%.1e" % r["rel_err"])
                           for r in B["mm"]]))
    lines.append("")
    if B.get("strided"):
        lines.append("Strided operands are copied to a dense block first (ops-src/strided.h), "
                     "except a channels_last input of a 1x1 with fewer output than input "
                     "channels, read in place (1x1 256->64 here); what that costs, conv2d "
                     "forward on a channels_last input against the same input contiguous "
                     "(information):")
        lines.append("")
        lines.append(md_table(["shape", "batch", "threads", "contiguous", "channels_last",
                               "the copy's share"],
                              [(r["label"], r["batch"], r["threads"], fms(r["contiguous_ms"]),
                                fms(r["channels_last_ms"]), "%.0f%%" % (100 * r["copy_share"]))
                               for r in B["strided"]]))
        lines.append("")
    return lines


if __name__ == "__main__":
    main()
