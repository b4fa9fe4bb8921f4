"""bench/torch2_bench.py - the torch2 rows of bench/run: opjit ops as torch 2
custom ops, against torch's own ways of doing the same, side by side in one
process, interleaved repetition by repetition, median reported.

- call: the cost of one call of an opjit op through torch.ops (tiny 4x4
  float32 mm, as register_torch defines it: schema, fake kernel, autograd
  formula) against a torch.library.custom_op defined in Python doing the
  same work (torch.mm inside, register_fake and register_autograd too), at
  one thread. For scale: the same custom_op wrapping the opjit call, the
  opjit op called directly, torch.mm.
- train: one training step (forward, backward, SGD step) of a small CNN
  built from opjit conv2d and torch's elementwise ops, pooling and linear,
  against the same model with F.conv2d; eager and under torch.compile
  (inductor), at 1 thread and at the machine's core count (opjit's runtime
  threads and torch.set_num_threads alike). The compile itself is timed
  apart.

Run by bench.py with the torch 2 interpreter (the development virtual
environment) and the opjit package built for it on PYTHONPATH. Standalone:

    PYTHONPATH=build/python-extra OPJIT_OPS_PATH=$PWD/ops-src \\
        ~/.cache/opjit-dev/torch2/bin/python bench/torch2_bench.py --reps 7 --out r.json
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch2_run

import torch
import torch.nn.functional as F

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SETTLE = 0.05  # after a timed repetition with threads: OpenMP threads spin a while
TINY = 4
BATCH, SIZE = 8, 32


def log(msg):
    print("torch2_bench: " + msg, file=sys.stderr, flush=True)


def calibrate(fn, target):
    """Calls a repetition makes to last about target seconds."""
    return torch2_run.calibrate(fn, target, cap=1 << 20)


# bench/run --smoke: a twentieth of the time per repetition.
TARGET_SCALE = 0.05 if os.environ.get("OPJIT_BENCH_SMOKE") == "1" else 1.0


def interleaved(sides, reps, target, settle=0.0):
    """{name: median seconds per call}: one repetition of each side in
    turn, reps times."""
    target *= TARGET_SCALE
    counts = {k: calibrate(fn, target) for k, fn in sides.items()}
    times = {k: [] for k in sides}
    for _ in range(reps):
        for k, fn in sides.items():
            n = counts[k]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[k].append((time.perf_counter() - t0) / n)
            if settle:
                time.sleep(settle)
    return {k: statistics.median(v) for k, v in times.items()}


def runtime(threads, cache_dir=None):
    """An opjit runtime with that many threads and the shipped ops, whose
    loads wait for the optimizing tier (the code a warm process runs, as
    bench.py's rows; cache_dir: where, by default a fresh directory)."""
    import opjit
    import tempfile
    os.environ["OPJIT_NUM_THREADS"] = str(threads)
    try:
        rt = opjit.Runtime(ops_path=os.path.join(ROOT, "ops-src"), tiering=True,
                           cache_dir=cache_dir or tempfile.mkdtemp(prefix="opjit-torch2-bench-"))
    finally:
        del os.environ["OPJIT_NUM_THREADS"]
    return rt


def load(rt, name):
    op = rt.load_op(name)
    rt.wait()
    if op.tier != "opt":
        log("warning: %s runs %s code: no optimizing compiler here?" % (name, op.tier))
    return op


# ---- call overhead ------------------------------------------------------------

def python_custom_ops(opjit_mm):
    """Two custom ops defined in Python as torch documents it: torch.mm
    inside, and the opjit op inside; both with a fake kernel and an
    autograd formula, as register_torch gives opjit's."""
    lib = "opjit_bench"

    @torch.library.custom_op(lib + "::mm_torch", mutates_args=())
    def mm_torch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mm(a, b)

    @torch.library.custom_op(lib + "::mm_wrapped", mutates_args=())
    def mm_wrapped(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return opjit_mm(a, b)

    for op in (mm_torch, mm_wrapped):
        op.register_fake(lambda a, b: a.new_empty(a.shape[0], b.shape[1]))
        op.register_autograd(
            lambda ctx, g: (g.mm(ctx.b.t()), ctx.a.t().mm(g)),
            setup_context=lambda ctx, inputs, output: ctx.__setattr__("a", inputs[0]) or
            ctx.__setattr__("b", inputs[1]))
    return mm_torch, mm_wrapped


def bench_call(reps):
    import opjit
    torch.set_num_threads(1)
    rt = runtime(1)
    mm = load(rt, "mm")
    registered = opjit.register_torch(mm, namespace="opjit_bench_call")
    mm_torch, mm_wrapped = python_custom_ops(mm)
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(TINY, TINY, generator=g), torch.randn(TINY, TINY, generator=g)
    want = torch.mm(a, b)
    for f in (registered, mm_torch, mm_wrapped, mm):
        torch.testing.assert_close(f(a, b), want)
    sides = {
        "opjit_torch_ops": lambda: registered(a, b),
        "custom_op_torch_mm": lambda: mm_torch(a, b),
        "custom_op_opjit": lambda: mm_wrapped(a, b),
        "opjit_direct": lambda: mm(a, b),
        "torch_mm": lambda: torch.mm(a, b),
    }
    log("call: tiny %dx%d mm through torch.ops against a Python custom_op (%d reps)"
        % (TINY, TINY, reps))
    t = interleaved(sides, reps, 0.1)
    return {"us": {k: v * 1e6 for k, v in t.items()},
            "ratio": t["opjit_torch_ops"] / t["custom_op_torch_mm"],
            "torch": torch.__version__, "shape": [TINY, TINY]}


# ---- a training step ------------------------------------------------------------

class Net(torch.nn.Module):
    """Three 3x3 convolutions (the second strided), ReLU, average pooling,
    a linear layer: conv is opjit's conv2d or F.conv2d."""

    def __init__(self, conv):
        super().__init__()
        g = torch.Generator().manual_seed(2)
        self.conv = conv
        self.w1 = torch.nn.Parameter(torch.randn(16, 3, 3, 3, generator=g) * 0.2)
        self.b1 = torch.nn.Parameter(torch.zeros(16))
        self.w2 = torch.nn.Parameter(torch.randn(32, 16, 3, 3, generator=g) * 0.08)
        self.b2 = torch.nn.Parameter(torch.zeros(32))
        self.w3 = torch.nn.Parameter(torch.randn(32, 32, 3, 3, generator=g) * 0.06)
        self.b3 = torch.nn.Parameter(torch.zeros(32))
        self.fc = torch.nn.Linear(32, 10)
        with torch.no_grad():  # not torch's random init: both models alike
            self.fc.weight.copy_(torch.randn(10, 32, generator=g) * 0.1)
            self.fc.bias.zero_()

    def forward(self, x):
        y = F.relu(self.conv(x, self.w1, self.b1, [1, 1], [1, 1]))
        y = F.relu(self.conv(y, self.w2, self.b2, [2, 2], [1, 1]))
        y = F.relu(self.conv(y, self.w3, self.b3, [1, 1], [1, 1]))
        return self.fc(y.mean((2, 3)))


def make_step(net, compiled):
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    fwd = torch.compile(net) if compiled else net
    g = torch.Generator().manual_seed(3)
    x = torch.randn(BATCH, 3, SIZE, SIZE, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(fwd(x), y).backward()
        opt.step()
    return step


def check_same_gradients(conv_opjit):
    """Both models compute the same gradients (eager), so the rows time the
    same work."""
    grads = []
    for conv in (conv_opjit, F.conv2d):
        net = Net(conv)
        g = torch.Generator().manual_seed(4)
        x = torch.randn(2, 3, SIZE, SIZE, generator=g)
        F.cross_entropy(net(x), torch.tensor([1, 7])).backward()
        grads.append([p.grad for p in net.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def bench_train(reps, threads):
    import opjit
    out = {}
    for T in threads:
        torch.set_num_threads(T)
        rt = runtime(T)
        op = load(rt, "conv2d")
        if op.declarations["gradient"] != "derivative":
            return {"missing": "conv2d declares no derivative here"}
        conv = opjit.register_torch(op, namespace="opjit_bench_t%d" % T)
        log("train: opjit conv2d and conv2d_backward run %s code" % rt.load_op("conv2d").tier)
        check_same_gradients(conv)
        for compiled in (False, True):
            torch._dynamo.reset()
            key = "%s %dt" % ("compiled" if compiled else "eager", T)
            steps = {}
            t_compile = {}
            for side, c in (("opjit", conv), ("torch", F.conv2d)):
                steps[side] = make_step(Net(c), compiled)
                t0 = time.perf_counter()
                steps[side]()  # the compile, for a compiled step
                steps[side]()
                t_compile[side] = time.perf_counter() - t0
            log("train: %s, batch %d of 3x%dx%d (%d reps)" % (key, BATCH, SIZE, SIZE, reps))
            t = interleaved(steps, reps, 0.3, SETTLE if T > 1 else 0.0)
            out[key] = {"ms": {k: v * 1e3 for k, v in t.items()},
                        "ratio": t["torch"] / t["opjit"],
                        "first_two_steps_s": t_compile}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", default="", help="e.g. 1,2 (default 1 and the CPUs)")
    ap.add_argument("--only", default="call,train")
    ap.add_argument("--out", default="", help="write the results as JSON here")
    a = ap.parse_args()
    ncpu = len(os.sched_getaffinity(0))
    threads = sorted({int(x) for x in a.threads.split(",")}) if a.threads else \
        sorted({1, ncpu})
    only = set(a.only.split(","))
    R = {"torch": torch.__version__, "threads": threads, "reps": a.reps,
         "python": sys.version.split()[0]}
    if "call" in only:
        R["call"] = bench_call(a.reps)
    if "train" in only:
        R["train"] = bench_train(a.reps, threads)
    text = json.dumps(R, indent=1, sort_keys=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
