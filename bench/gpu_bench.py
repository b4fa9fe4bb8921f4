#!/usr/bin/env python3
"""bench/gpu_bench.py - opjit's CUDA ops against PyTorch on a real GPU.

Run by scripts/gpu-check (which builds libopjit.so, the opjit CLI and
bench/gpu_helper.so first):

    python3 bench/gpu_bench.py --build BUILD --helper gpu_helper.so --out DIR [--quick]

Both sides run in this process, on the same stream (opjit is handed
torch's current stream with opjit_set_cuda_stream) and the same input
tensors, interleaved repetition by repetition; each figure is the median
over repetitions of CUDA-event time per call (the loop of opjit calls runs
in C, bench/gpu_helper.c; torch's loop is Python calling the op, as a torch
user would). Every opjit result is checked against the anchor's before it
is timed. Writes DIR/gpu-latest.md and DIR/gpu-latest.json.
"""
import argparse
import ctypes
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
import torchvision

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Opjit:
    """The few opjit entry points the bench needs, through ctypes."""

    def __init__(self, lib, helper, cache_dir, stream):
        self.lib = ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        self.h = ctypes.CDLL(helper)
        L = self.lib
        L.opjit_errmsg.restype = ctypes.c_char_p
        L.opjit_errmsg.argtypes = [ctypes.c_void_p]
        L.opjit_create.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        L.opjit_load_file.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                      ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        L.opjit_set_cuda_stream.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                            ctypes.c_void_p]
        L.opjit_destroy.argtypes = [ctypes.c_void_p]
        vp, i64, dbl, ci = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_int
        self.h.gb_nms.argtypes = [vp, vp, vp, vp, i64, ci, dbl, ci, ctypes.POINTER(vp)]
        self.h.gb_mm.argtypes = [vp, vp, vp, vp, i64, i64, i64, ci, ci, ctypes.POINTER(vp)]
        self.h.gb_conv.argtypes = [vp, vp, vp, vp, vp, ctypes.POINTER(i64), ci, ci,
                                   ctypes.POINTER(vp)]
        os.environ["OPJIT_CACHE_DIR"] = cache_dir
        os.environ["OPJIT_TIERING"] = "0"
        self.rt = ctypes.c_void_p()
        self.check(L.opjit_create(None, ctypes.byref(self.rt)), "opjit_create")
        self.check(L.opjit_set_cuda_stream(self.rt, 0, None, ctypes.c_void_p(stream)),
                   "opjit_set_cuda_stream")
        self.capsule_new = ctypes.pythonapi.PyCapsule_New
        self.capsule_new.restype = ctypes.py_object
        self.capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

    def check(self, rc, what):
        if rc:
            msg = self.lib.opjit_errmsg(self.rt) if self.rt else b""
            raise RuntimeError("%s: status %d: %s" % (what, rc, (msg or b"").decode()))

    def load(self, path):
        op = ctypes.c_void_p()
        t0 = time.perf_counter()
        self.check(self.lib.opjit_load_file(self.rt, path.encode(), ctypes.byref(op), None), path)
        return op, (time.perf_counter() - t0) * 1e3

    def to_torch(self, managed):
        """An opjit output (DLManagedTensor *) as a torch tensor, zero-copy."""
        return torch.utils.dlpack.from_dlpack(self.capsule_new(managed, b"dltensor", None))

    def nms(self, op, boxes, scores, iou, iters, keep_last=False):
        last = ctypes.c_void_p()
        bits = 64 if boxes.dtype == torch.float64 else 32
        self.check(self.h.gb_nms(self.rt, op, boxes.data_ptr(), scores.data_ptr(), boxes.shape[0],
                                 bits, iou, iters, ctypes.byref(last) if keep_last else None),
                   "nms")
        return self.to_torch(last) if keep_last else None

    def mm(self, op, a, b, iters, keep_last=False):
        last = ctypes.c_void_p()
        bits = 64 if a.dtype == torch.float64 else 32
        self.check(self.h.gb_mm(self.rt, op, a.data_ptr(), b.data_ptr(), a.shape[0], a.shape[1],
                                b.shape[1], bits, iters,
                                ctypes.byref(last) if keep_last else None), "mm")
        return self.to_torch(last) if keep_last else None

    def conv(self, op, x, w, bias, stride, pad, dil, groups, iters, keep_last=False):
        last = ctypes.c_void_p()
        g = (ctypes.c_int64 * 14)(x.shape[0], x.shape[1], x.shape[2], x.shape[3], w.shape[0],
                                  w.shape[2], w.shape[3], stride, stride, pad, pad, dil, dil,
                                  groups)
        self.check(self.h.gb_conv(self.rt, op, x.data_ptr(), w.data_ptr(),
                                  bias.data_ptr() if bias is not None else None, g, 32, iters,
                                  ctypes.byref(last) if keep_last else None), "conv2d")
        return self.to_torch(last) if keep_last else None


def event_time(fn, iters):
    """Milliseconds per call of fn (which runs `iters` calls), CUDA events on
    the current stream, after the work queued before it has finished."""
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn(iters)
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / iters


def compare(sides, reps, iters):
    """sides: name -> fn(iters). Interleaved repetitions; medians (ms/call)."""
    for fn in sides.values():  # warm-up: modules, handles, pools, algorithms
        fn(max(1, iters // 4))
    times = {k: [] for k in sides}
    for _ in range(reps):
        for k, fn in sides.items():
            times[k].append(event_time(fn, iters))
    return {k: statistics.median(v) for k, v in times.items()}, times


def nms_boxes(n, clustered, gen, device="cuda"):
    if clustered:  # a detector's output: ~25 boxes per object, jittered around it
        objs = max(1, n // 25)
        centers = torch.rand(objs, 2, generator=gen, dtype=torch.float64) * 1000
        sizes = 20 + torch.rand(objs, 2, generator=gen, dtype=torch.float64) * 150
        idx = torch.randint(0, objs, (n,), generator=gen)
        c = centers[idx] + torch.randn(n, 2, generator=gen, dtype=torch.float64) * 6
        wh = sizes[idx] * (0.85 + 0.3 * torch.rand(n, 2, generator=gen, dtype=torch.float64))
    else:
        c = torch.rand(n, 2, generator=gen, dtype=torch.float64) * 1000
        wh = 10 + torch.rand(n, 2, generator=gen, dtype=torch.float64) * 50
    boxes = torch.cat([c - wh / 2, c + wh / 2], 1).float()
    scores = torch.rand(n, generator=gen, dtype=torch.float64).float()
    return boxes.to(device), scores.to(device)


RESNET50 = [  # (C, H, O, k, stride, pad) of ResNet-50 layers
    (64, 56, 64, 1, 1, 0),
    (64, 56, 64, 3, 1, 1),
    (64, 56, 256, 1, 1, 0),
    (128, 28, 128, 3, 1, 1),
    (256, 14, 256, 3, 1, 1),
    (512, 7, 512, 3, 1, 1),
    (256, 56, 512, 1, 2, 0),
]


def rel_err(got, ref):
    return ((got.double() - ref).norm() / ref.norm()).item()


def guarded(rows, row, fn):
    """Append row after fn(row) fills it; an exception is kept in the row
    (the run goes on: one GPU run must bring back every other row)."""
    try:
        fn(row)
    except Exception as e:  # noqa: BLE001 - reported in the table
        row["error"] = ("%s: %s" % (type(e).__name__, e))[-300:]
    rows.append(row)
    print(row, flush=True)


def py_rows(R, reps, quick, device="cuda"):
    """Through the Python package, as a torch user calls opjit: torch tensors
    on the device in and out, on torch's current stream. float16 and
    bfloat16 (conv2d, mm, nms) and the float32 gradients against torch in
    the same dtype."""
    import opjit
    rt = opjit.Runtime(ops_path=[os.path.join(ROOT, "ops-src")], tiering=False)
    ops = {n: rt.load_op(n) for n in ("nms", "mm", "mm_backward", "conv2d", "conv2d_backward")}
    batches = (1, 32) if quick else (1, 8, 32)
    torch.backends.cudnn.allow_tf32 = False
    R["half"] = []
    for dtype in ("float16", "bfloat16"):
        dt = getattr(torch, dtype)
        for batch in batches:
            for (c, h, o, k, s, p) in RESNET50:
                def conv_row(row):
                    x = torch.randn(batch, c, h, h, device=device).to(dt)
                    w = (torch.randn(o, c, k, k, device=device) / (c * k * k) ** 0.5).to(dt)
                    b = torch.randn(o, device=device).to(dt)
                    ref = F.conv2d(x.double(), w.double(), b.double(), s, p)
                    row["rel_err"] = rel_err(ops["conv2d"](x, w, b, s, p), ref)
                    row["torch_rel_err"] = rel_err(F.conv2d(x, w, b, s, p), ref)
                    med, _ = compare({
                        "opjit": lambda it: [ops["conv2d"](x, w, b, s, p) for _ in range(it)],
                        "torch": lambda it: [F.conv2d(x, w, b, s, p) for _ in range(it)]},
                        reps, 10)
                    row.update(opjit_ms=med["opjit"], torch_ms=med["torch"])
                guarded(R["half"], {"op": "conv2d", "dtype": dtype, "batch": batch,
                                    "shape": [c, h, o, k, s, p]}, conv_row)
        for n in ((4096,) if quick else (4096, 8192)):
            def mm_row(row):
                a = torch.randn(n, n, device=device).to(dt)
                b = torch.randn(n, n, device=device).to(dt)
                ref = torch.mm(a.double(), b.double())
                row["rel_err"] = rel_err(ops["mm"](a, b), ref)
                row["torch_rel_err"] = rel_err(torch.mm(a, b), ref)
                iters = 20 if n <= 4096 else 5
                med, _ = compare({"opjit": lambda it: [ops["mm"](a, b) for _ in range(it)],
                                  "torch": lambda it: [torch.mm(a, b) for _ in range(it)]},
                                 reps, iters)
                flops = 2.0 * n * n * n
                row.update(opjit_ms=med["opjit"], torch_ms=med["torch"],
                           opjit_tflops=flops / med["opjit"] / 1e9,
                           torch_tflops=flops / med["torch"] / 1e9)
            guarded(R["half"], {"op": "mm", "dtype": dtype, "n": n}, mm_row)

    # float16 boxes (torchvision's CUDA nms takes float16, not bfloat16)
    dtype, dt = "float16", torch.float16
    gen = torch.Generator().manual_seed(99)
    for n in (1000, 10000):
        def nms_row(row):
            boxes, scores = nms_boxes(n, False, gen, device)
            boxes, scores = boxes.to(dt), scores.to(dt)
            got = ops["nms"](boxes, scores, 0.5)
            ref = torchvision.ops.nms(boxes, scores, 0.5)
            cpu = ops["nms"](boxes.cpu(), scores.cpu(), 0.5)
            row.update(kept=int(got.numel()), identical=bool(torch.equal(got.cpu(), ref.cpu())),
                       cpu_twin_identical=bool(torch.equal(got.cpu(), cpu)))
            # opjit widens the boxes to float32 exactly first; torchvision's kernel
            # may round otherwise near the threshold: count what either keeps alone.
            row["differ"] = int(len(set(got.tolist()) ^ set(ref.tolist())))
            med, _ = compare({
                "opjit": lambda it: [ops["nms"](boxes, scores, 0.5) for _ in range(it)],
                "torchvision": lambda it: [torchvision.ops.nms(boxes, scores, 0.5)
                                           for _ in range(it)]}, reps, 20)
            row.update(opjit_ms=med["opjit"], torchvision_ms=med["torchvision"])
        guarded(R["half"], {"op": "nms", "dtype": dtype, "n": n}, nms_row)

    R["backward"] = []
    for batch in batches:
        for (c, h, o, k, s, p) in RESNET50:
            def conv_bw_row(row):
                x = torch.randn(batch, c, h, h, device=device)
                w = torch.randn(o, c, k, k, device=device) / (c * k * k) ** 0.5
                b = torch.randn(o, device=device)
                gy = torch.randn_like(F.conv2d(x, w, b, s, p))

                def torch_bw():
                    return torch.ops.aten.convolution_backward(
                        gy, x, w, [o], [s, s], [p, p], [1, 1], False, [0, 0], 1,
                        [True, True, True])
                ref = torch.ops.aten.convolution_backward(
                    gy.double(), x.double(), w.double(), [o], [s, s], [p, p], [1, 1], False,
                    [0, 0], 1, [True, True, True])
                got = ops["conv2d_backward"](gy, x, w, b, s, p)
                want = torch_bw()
                row["rel_err"] = [rel_err(g, r) for g, r in zip(got, ref)]
                row["torch_rel_err"] = [rel_err(g, r) for g, r in zip(want, ref)]
                med, _ = compare({
                    "opjit": lambda it: [ops["conv2d_backward"](gy, x, w, b, s, p)
                                         for _ in range(it)],
                    "torch": lambda it: [torch_bw() for _ in range(it)]}, reps, 10)
                row.update(opjit_ms=med["opjit"], torch_ms=med["torch"])
            guarded(R["backward"], {"op": "conv2d_backward", "batch": batch,
                                    "shape": [c, h, o, k, s, p]}, conv_bw_row)
    for n in ((1024,) if quick else (1024, 4096)):
        def mm_bw_row(row):
            a = torch.randn(n, n, device=device)
            b = torch.randn(n, n, device=device)
            gy = torch.randn(n, n, device=device)
            ref = (torch.mm(gy.double(), b.double().t()), torch.mm(a.double().t(), gy.double()))
            got = ops["mm_backward"](gy, a, b)
            row["rel_err"] = [rel_err(g, r) for g, r in zip(got, ref)]
            med, _ = compare({
                "opjit": lambda it: [ops["mm_backward"](gy, a, b) for _ in range(it)],
                # autograd's mm backward: grad @ mat2^T, self^T @ grad
                "torch": lambda it: [(torch.mm(gy, b.t()), torch.mm(a.t(), gy))
                                     for _ in range(it)]}, reps, 10 if n <= 1024 else 4)
            row.update(opjit_ms=med["opjit"], torch_ms=med["torch"])
        guarded(R["backward"], {"op": "mm_backward", "n": n}, mm_bw_row)

    # Per call from Python, tiny inputs: the package's own cost on CUDA tensors.
    def py_overhead(row):
        a4 = torch.randn(4, 4, device=device)
        med, _ = compare({"opjit": lambda it: [ops["mm"](a4, a4) for _ in range(it)],
                          "torch": lambda it: [torch.mm(a4, a4) for _ in range(it)]}, reps, 2000)
        row.update(opjit_ms=med["opjit"], torch_ms=med["torch"])
    R["py_overhead"] = []
    guarded(R["py_overhead"], {"op": "mm 4x4"}, py_overhead)
    torch.backends.cudnn.allow_tf32 = True


def cli_load(cli, src, cache, archs):
    """One fresh `opjit load SRC` process: (in-process total ms, process wall ms, hit?)."""
    env = dict(os.environ, OPJIT_CACHE_DIR=cache, OPJIT_TIERING="0")
    if archs:
        env["OPJIT_CUDA_ARCHS"] = archs
    else:
        env.pop("OPJIT_CUDA_ARCHS", None)
    t0 = time.perf_counter()
    p = subprocess.run([cli, "load", src], env=env, capture_output=True, text=True)
    wall = (time.perf_counter() - t0) * 1e3
    if p.returncode:
        raise RuntimeError("opjit load %s: %s" % (src, p.stderr.strip()))
    total = float(p.stdout.split("total ")[1].split(" ms")[0])
    return total, wall, "cache hit" in p.stdout


LOAD_INLINE = r'''
import sys, time, torch
from torch.utils.cpp_extension import load_inline
src = open(sys.argv[1]).read()
dev = src.split("#ifdef __CUDACC_RTC__", 1)[1].split("#else", 1)[0]
cuda = dev + r"""
#include <torch/extension.h>
torch::Tensor nms_mask_only(torch::Tensor sorted, double thr) {
    int n = sorted.size(0), cols = (n + 63) / 64;
    auto mask = torch::empty({n, cols}, sorted.options().dtype(torch::kInt64));
    nms_mask_f32<<<dim3(cols, cols), 64>>>(n, thr, sorted.data_ptr<float>(),
        (unsigned long long *)mask.data_ptr<int64_t>(), cols);
    return mask;
}
"""
t0 = time.perf_counter()
m = load_inline("opjit_nms_anchor", cpp_sources="torch::Tensor nms_mask_only(torch::Tensor sorted, double thr);",
                cuda_sources=cuda, functions=["nms_mask_only"], verbose=False,
                extra_cuda_cflags=["-arch=sm_%s" % sys.argv[2]])
print("ms %.1f" % ((time.perf_counter() - t0) * 1e3))
'''


def load_rows(args, R):
    cc = "%d%d" % torch.cuda.get_device_capability()
    src = os.path.join(ROOT, "ops-src", "nms.cu")
    cold, hit, hit_drv = [], [], []
    for _ in range(3 if args.quick else 5):
        d = tempfile.mkdtemp(prefix="gb-load-")
        cold.append(cli_load(args.cli, src, d, "sm_" + cc))
        hit.append(cli_load(args.cli, src, d, "sm_" + cc))
        hit_drv.append(cli_load(args.cli, src, d, None))
        shutil.rmtree(d, ignore_errors=True)
    R["nvrtc_load"] = {"arch": "sm_" + cc, "cold": cold, "hit": hit, "hit_driver_archs": hit_drv}
    # The anchor: torch cpp_extension's load_inline of the same kernel with nvcc.
    li = {"cold_ms": None, "hit_ms": None, "error": None}
    if os.environ.get("OPJIT_GPU_BENCH_NO_INLINE") == "1":
        li["error"] = "left out (OPJIT_GPU_BENCH_NO_INLINE=1)"
        R["load_inline"] = li
        return
    d = tempfile.mkdtemp(prefix="gb-inline-")
    try:
        script = os.path.join(d, "li.py")
        open(script, "w").write(LOAD_INLINE)
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=os.path.join(d, "ext"))
        for key in ("cold_ms", "hit_ms"):
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, script, src, cc], env=env, capture_output=True,
                               text=True, timeout=600)
            wall = (time.perf_counter() - t0) * 1e3
            if p.returncode:
                li["error"] = (p.stderr or p.stdout).strip()[-600:]
                break
            li[key] = {"in_process": float(p.stdout.split("ms ")[-1]), "wall": wall}
    except Exception as e:  # the anchor is reported as missing, not fatal
        li["error"] = str(e)
    shutil.rmtree(d, ignore_errors=True)
    R["load_inline"] = li


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="the build dir with libopjit.so and opjit")
    ap.add_argument("--helper", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    args.cli = os.path.join(args.build, "opjit")
    reps = 5 if args.quick else 15
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's default: true float32 GEMMs
    stream = torch.cuda.current_stream()
    cache = tempfile.mkdtemp(prefix="gb-cache-")
    oj = Opjit(os.path.join(args.build, "libopjit.so"), args.helper, cache, stream.cuda_stream)
    R = {"env": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "torchvision": torchvision.__version__, "cuda": torch.version.cuda,
                 "cudnn": torch.backends.cudnn.version(), "host": platform.node(),
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "reps": reps}}
    ops = {}
    for name in ("nms", "mm", "conv2d"):
        op, ms = oj.load(os.path.join(ROOT, "ops-src", name + ".cu"))
        ops[name] = op
        R.setdefault("first_load_ms", {})[name] = ms
    gen = torch.Generator().manual_seed(1234)

    # ---- nms ----
    R["nms"] = []
    for n, clustered in [(1000, False), (10000, False), (100000, False), (10000, True)]:
        boxes, scores = nms_boxes(n, clustered, gen)
        ref = torchvision.ops.nms(boxes, scores, 0.5)
        got = oj.nms(ops["nms"], boxes, scores, 0.5, 1, keep_last=True)
        same = torch.equal(ref.cpu(), got.cpu())
        iters = 3 if n >= 100000 else 20
        med, _ = compare({"opjit": lambda it: oj.nms(ops["nms"], boxes, scores, 0.5, it),
                          "torchvision": lambda it: [torchvision.ops.nms(boxes, scores, 0.5)
                                                     for _ in range(it)]}, reps, iters)
        R["nms"].append({"n": n, "clustered": clustered, "kept": int(ref.numel()),
                         "identical": bool(same), "opjit_ms": med["opjit"],
                         "torchvision_ms": med["torchvision"]})
        print("nms %6d %s: opjit %.3f ms, torchvision %.3f ms, identical %s" % (
            n, "clustered" if clustered else "random", med["opjit"], med["torchvision"], same),
            flush=True)

    # ---- conv2d ----
    R["conv2d"] = []
    for batch in (1, 8, 32):
        for (c, h, o, k, s, p) in RESNET50:
            x = torch.randn(batch, c, h, h, device="cuda", generator=None)
            w = torch.randn(o, c, k, k, device="cuda") * (1.0 / (c * k * k) ** 0.5)
            b = torch.randn(o, device="cuda")
            torch.backends.cudnn.allow_tf32 = False
            ref = F.conv2d(x, w, b, s, p)
            got = oj.conv(ops["conv2d"], x, w, b, s, p, 1, 1, 1, keep_last=True)
            err = ((got - ref).norm() / ref.norm()).item()
            iters = 10

            def torch_fp32(it):
                torch.backends.cudnn.allow_tf32 = False
                for _ in range(it):
                    F.conv2d(x, w, b, s, p)

            def torch_default(it):
                torch.backends.cudnn.allow_tf32 = True  # torch's default for convolutions
                for _ in range(it):
                    F.conv2d(x, w, b, s, p)

            def opjit_legacy(it):  # cuDNN's legacy API, as conv2d.cu ran before its plans
                os.environ["OPJIT_CUDNN_GRAPH"] = "0"
                try:
                    oj.conv(ops["conv2d"], x, w, b, s, p, 1, 1, it)
                finally:
                    os.environ.pop("OPJIT_CUDNN_GRAPH", None)

            med, _ = compare({"opjit": lambda it: oj.conv(ops["conv2d"], x, w, b, s, p, 1, 1, it),
                              "opjit_legacy": opjit_legacy,
                              "torch_fp32": torch_fp32, "torch_tf32": torch_default}, reps, iters)
            torch.backends.cudnn.allow_tf32 = True
            R["conv2d"].append({"batch": batch, "shape": [c, h, o, k, s, p], "rel_err": err,
                                "opjit_ms": med["opjit"], "opjit_legacy_ms": med["opjit_legacy"],
                                "torch_fp32_ms": med["torch_fp32"],
                                "torch_tf32_ms": med["torch_tf32"]})
            print("conv2d b%d C%d H%d O%d k%d s%d: opjit %.3f (legacy API %.3f), torch fp32 %.3f, "
                  "torch tf32 %.3f ms, err %.1e" % (batch, c, h, o, k, s, med["opjit"],
                                                    med["opjit_legacy"], med["torch_fp32"],
                                                    med["torch_tf32"], err), flush=True)

    # ---- mm ----
    R["mm"] = []
    for n in (1024, 4096, 8192):
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")
        ref = torch.mm(a.double(), b.double())
        got = oj.mm(ops["mm"], a, b, 1, keep_last=True)
        err = ((got.double() - ref).norm() / ref.norm()).item()
        terr = ((torch.mm(a, b).double() - ref).norm() / ref.norm()).item()
        iters = 20 if n <= 4096 else 5
        med, _ = compare({"opjit": lambda it: oj.mm(ops["mm"], a, b, it),
                          "torch": lambda it: [torch.mm(a, b) for _ in range(it)]}, reps, iters)
        flops = 2.0 * n * n * n
        R["mm"].append({"n": n, "rel_err": err, "torch_rel_err": terr, "opjit_ms": med["opjit"],
                        "torch_ms": med["torch"],
                        "opjit_tflops": flops / med["opjit"] / 1e9,
                        "torch_tflops": flops / med["torch"] / 1e9})
        print("mm %d: opjit %.3f ms (%.1f TFLOP/s), torch %.3f ms, err %.1e (torch %.1e)" % (
            n, med["opjit"], flops / med["opjit"] / 1e9, med["torch"], err, terr), flush=True)

    # ---- per-call overhead on tiny inputs ----
    R["overhead"] = {}
    a4 = torch.randn(4, 4, device="cuda")
    bx, sc = nms_boxes(8, False, gen)
    med, _ = compare({"opjit": lambda it: oj.mm(ops["mm"], a4, a4, it),
                      "torch": lambda it: [torch.mm(a4, a4) for _ in range(it)]}, reps, 2000)
    R["overhead"]["mm4"] = med
    med, _ = compare({"opjit": lambda it: oj.nms(ops["nms"], bx, sc, 0.5, it),
                      "torchvision": lambda it: [torchvision.ops.nms(bx, sc, 0.5)
                                                 for _ in range(it)]}, reps, 500)
    R["overhead"]["nms8"] = med
    print("overhead:", R["overhead"], flush=True)

    try:  # the package may be missing (built without Python headers): the rest stands
        py_rows(R, reps, args.quick)
    except Exception as e:  # noqa: BLE001 - reported in the table
        R["py_overhead"] = [{"op": "mm 4x4", "error": "the Python rows did not run: %s: %s" % (
            type(e).__name__, e)}]
        print("py_rows:", R["py_overhead"][0]["error"], flush=True)
    load_rows(args, R)
    oj.lib.opjit_destroy(oj.rt)
    shutil.rmtree(cache, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu-latest.json"), "w") as f:
        json.dump(R, f, indent=1)
    md = render(R)
    with open(os.path.join(args.out, "gpu-latest.md"), "w") as f:
        f.write(md)
    print(md)


def conv_name(r):
    c, h, o, k, s, p = r["shape"]
    return "b%d x[%d,%d,%d] w[%d,%d,%d,%d] s%d" % (r["batch"], c, h, h, o, c, k, k, s)


def py_row(r):
    """A py_rows row's name, and a function giving the rest of its table row."""
    op, yes = r["op"], lambda ok: "yes" if ok else "no"
    if op == "conv2d":
        def rest():
            ratio = r["opjit_ms"] / r["torch_ms"]
            return "(rel. err %.1e; torch %.1e) | %s | F.conv2d %s: %s | %.2fx time | <= 1.05x | %s" % (
                r["rel_err"], r["torch_rel_err"], fms(r["opjit_ms"]), r["dtype"],
                fms(r["torch_ms"]), ratio, yes(ratio <= 1.05))
        return "conv2d.cu %s, %s, from Python" % (conv_name(r), r["dtype"]), rest
    if op == "mm":
        def rest():
            ratio = r["opjit_tflops"] / r["torch_tflops"]
            return ("(rel. err %.1e; torch %.1e) | %.1f TFLOP/s | torch.mm %s: %.1f TFLOP/s | "
                    "%.3fx throughput | >= 0.95x | %s" % (
                        r["rel_err"], r["torch_rel_err"], r["opjit_tflops"], r["dtype"],
                        r["torch_tflops"], ratio, yes(ratio >= 0.95)))
        return "mm.cu %d^3 %s, from Python" % (r["n"], r["dtype"]), rest
    if op == "nms":
        def rest():
            ratio = r["opjit_ms"] / r["torchvision_ms"]
            return ("(%d kept; identical to torchvision: %s, %d differ; to the CPU twin: %s) | %s | "
                    "torchvision.ops.nms %s: %s | %.2fx time | <= 1.0x, identical | %s" % (
                        r["kept"], yes(r["identical"]), r["differ"],
                        "yes" if r["cpu_twin_identical"] else "NO", fms(r["opjit_ms"]),
                        r["dtype"], fms(r["torchvision_ms"]), ratio,
                        yes(ratio <= 1.0 and r["identical"])))
        return "nms.cu, %dk random boxes in %s, from Python" % (r["n"] // 1000, r["dtype"]), rest
    if op in ("conv2d_backward", "mm_backward"):
        anchor = ("aten.convolution_backward fp32" if op == "conv2d_backward"
                  else "torch.mm x2, autograd's order")

        def rest():
            ratio = r["opjit_ms"] / r["torch_ms"]
            return "(rel. err %s) | %s | %s: %s | %.2fx time | <= 1.05x | %s" % (
                "/".join("%.1e" % e for e in r["rel_err"]), fms(r["opjit_ms"]), anchor,
                fms(r["torch_ms"]), ratio, yes(ratio <= 1.05))
        what = ("conv2d_backward (cuDNN) %s, fp32, from Python" % conv_name(r)
                if op == "conv2d_backward" else "mm_backward (cuBLAS) %d^3 fp32, from Python" % r["n"])
        return what, rest

    def rest():
        return "| %.2f us | torch.mm: %.2f us | %.2fx | report | -" % (
            r["opjit_ms"] * 1e3, r["torch_ms"] * 1e3, r["opjit_ms"] / r["torch_ms"])
    return "per call from Python, mm 4x4 on CUDA tensors", rest


def render_py_rows(R):
    """The rows py_rows measured (a row that failed says why)."""
    L = []
    for r in R.get("half", []) + R.get("backward", []) + R.get("py_overhead", []):
        what, rest = py_row(r)
        if "error" in r:
            L.append("| %s | failed: %s | | | | no |" % (what, r["error"].replace("|", "/")))
        else:
            L.append("| %s %s |" % (what, rest()))
    return L


def fms(ms):
    return "%.3f ms" % ms if ms < 10 else "%.1f ms" % ms


def render(R):
    E = R["env"]
    L = ["# opjit on a GPU: bench/gpu_bench.py", "",
         "%s, torch %s (CUDA %s, cuDNN %s), torchvision %s; %s; medians of %d interleaved "
         "repetitions, CUDA-event time per call, both sides in one process on torch's current "
         "stream." % (E["gpu"], E["torch"], E["cuda"], E["cudnn"], E["torchvision"], E["date"],
                      E["reps"]), "",
         "| metric | opjit | anchor | ratio | goal | met |", "|---|---|---|---|---|---|"]
    for r in R["nms"]:
        ratio = r["opjit_ms"] / r["torchvision_ms"]
        L.append("| nms.cu, %dk %s boxes, IoU 0.5 (%d kept, identical: %s) | %s | torchvision.ops.nms: %s "
                 "| %.2fx time | <= 1.0x | %s |" % (
                     r["n"] // 1000, "clustered" if r["clustered"] else "random", r["kept"],
                     "yes" if r["identical"] else "NO", fms(r["opjit_ms"]), fms(r["torchvision_ms"]),
                     ratio, "yes" if ratio <= 1.0 and r["identical"] else "no"))
    for r in R["conv2d"]:
        c, h, o, k, s, p = r["shape"]
        ratio = r["opjit_ms"] / r["torch_fp32_ms"]
        L.append("| conv2d.cu b%d x[%d,%d,%d] w[%d,%d,%d,%d] s%d, fp32 (rel. err %.1e) | %s (legacy "
                 "API: %s) | F.conv2d fp32: %s (TF32, torch's default: %s) | %.2fx time | <= 1.05x "
                 "| %s |" % (
                     r["batch"], c, h, h, o, c, k, k, s, r["rel_err"], fms(r["opjit_ms"]),
                     fms(r["opjit_legacy_ms"]), fms(r["torch_fp32_ms"]), fms(r["torch_tf32_ms"]),
                     ratio, "yes" if ratio <= 1.05 else "no"))
    for r in R["mm"]:
        ratio = r["opjit_tflops"] / r["torch_tflops"]
        L.append("| mm.cu %d^3 fp32 (rel. err %.1e; torch %.1e) | %.1f TFLOP/s | torch.mm: %.1f TFLOP/s "
                 "| %.3fx throughput | >= 0.95x | %s |" % (
                     r["n"], r["rel_err"], r["torch_rel_err"], r["opjit_tflops"],
                     r["torch_tflops"], ratio, "yes" if ratio >= 0.95 else "no"))
    o = R["overhead"]
    L.append("| per call, mm 4x4 (opjit loop in C) | %.2f us | torch.mm from Python: %.2f us | %.2fx "
             "| <= 1.0x | %s |" % (o["mm4"]["opjit"] * 1e3, o["mm4"]["torch"] * 1e3,
                                  o["mm4"]["opjit"] / o["mm4"]["torch"],
                                  "yes" if o["mm4"]["opjit"] <= o["mm4"]["torch"] else "no"))
    L.append("| per call, nms 8 boxes | %.2f us | torchvision.ops.nms: %.2f us | %.2fx | <= 1.0x "
             "| %s |" % (o["nms8"]["opjit"] * 1e3, o["nms8"]["torchvision"] * 1e3,
                         o["nms8"]["opjit"] / o["nms8"]["torchvision"],
                         "yes" if o["nms8"]["opjit"] <= o["nms8"]["torchvision"] else "no"))
    L.extend(render_py_rows(R))
    nl = R["nvrtc_load"]
    med = lambda xs, i: statistics.median(x[i] for x in xs)
    li = R["load_inline"]
    anchor = ("load_inline (nvcc + ninja): %s in process, %s process" % (
        fms(li["cold_ms"]["in_process"]), fms(li["cold_ms"]["wall"]))
        if li.get("cold_ms") else "load_inline: n/a (%s)" % (li.get("error") or "?")[-200:].replace("\n", " ").replace("|", "/"))
    cold = med(nl["cold"], 0)
    ratio = ("%.0fx faster" % (li["cold_ms"]["in_process"] / cold)) if li.get("cold_ms") else "-"
    L.append("| NVRTC cold load of nms.cu for %s (fresh process, empty cache; in process / process wall) "
             "| %s / %s | %s | %s | report | - |" % (nl["arch"], fms(cold), fms(med(nl["cold"], 1)),
                                                  anchor, ratio))
    hit = med(nl["hit"], 0)
    anchor = ("load_inline hit: %s in process, %s process" % (
        fms(li["hit_ms"]["in_process"]), fms(li["hit_ms"]["wall"])) if li.get("hit_ms") else "-")
    L.append("| cache hit of nms.cu, fresh process, OPJIT_CUDA_ARCHS=%s (in process / process wall) "
             "| %s / %s | %s | | <= 2 ms | %s |" % (nl["arch"], fms(hit), fms(med(nl["hit"], 1)),
                                                   anchor, "yes" if hit <= 2 else "no"))
    L.append("| same, the arch found by asking the driver (cuInit in the process) | %s / %s | | | "
             "report | - |" % (fms(med(nl["hit_driver_archs"], 0)), fms(med(nl["hit_driver_archs"], 1))))
    L.append("")
    L.append("Notes: conv2d.cu runs cuDNN with FMA math (true float32, like its CPU twin), so its "
             "anchor is F.conv2d with `torch.backends.cudnn.allow_tf32 = False`; torch's default "
             "(TF32 tensor cores, lower precision) is shown beside it. torch.mm runs true float32 "
             "by default (`allow_tf32 = False`). The per-call rows time a loop of calls on tiny "
             "inputs, each including its device work and, for nms, its device-to-host copies. "
             "conv2d.cu's fp32 rows run cuDNN's graph API (plans kept per shape); beside them, "
             "the same op on cuDNN's legacy API (`OPJIT_CUDNN_GRAPH=0`). Rows 'from Python' call "
             "the op through the opjit package on torch CUDA tensors, as torch's side is called "
             "from Python too.")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
