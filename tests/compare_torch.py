#!/usr/bin/env python3
"""Compare the shipped CPU operators, run through the opjit CLI, with PyTorch.

    compare_torch.py --cli PATH/opjit --tmp DIR [--label NAME] [--quick]

Seeded random inputs are saved as .npy under DIR and run through
`opjit call OP NAME=VALUE... --out FILE.npy`; the results are compared with
torchvision.ops.nms (exact, index for index), torch.nn.functional.conv2d and
torch.mm (max abs error within a tolerance scaled to the values). Prints one
summary line per op and exits 1 on any mismatch or failed call.
"""
import argparse
import math
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from torchvision.ops import nms as tv_nms


class Runner:
    def __init__(self, cli, tmp):
        self.cli = cli
        self.tmp = tmp
        self.count = 0
        self.failures = []

    def save(self, name, a):
        path = os.path.join(self.tmp, f"{name}.npy")
        np.save(path, np.ascontiguousarray(a))
        return "@" + path

    def call(self, op, args):
        """Run `opjit call`; return the output array, or None (failure noted)."""
        self.count += 1
        out = os.path.join(self.tmp, "out.npy")
        if os.path.exists(out):
            os.remove(out)
        argv = [self.cli, "call", op] + [f"{k}={v}" for k, v in args.items()] + ["--out", out]
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            self.failures.append(f"{op}: call failed ({r.returncode}): {r.stderr.strip()}: {' '.join(argv)}")
            return None
        return np.load(out)

    def fail(self, msg):
        self.failures.append(msg)


def fmt_float(x):
    if math.isnan(x):
        return "nan"
    return repr(float(x))


# ---- nms ---------------------------------------------------------------------

def gen_boxes(rng, kind, n, dt):
    if kind == "uniform":
        xy = rng.random((n, 2)) * 1000
        wh = rng.random((n, 2)) * 60 + 1
    elif kind == "clustered":  # detector-like: many boxes around few objects
        c = rng.random((max(n // 30, 1), 2)) * 1000
        ci = rng.integers(0, len(c), n)
        xy = c[ci] + rng.normal(0, 6, (n, 2))
        wh = rng.random((n, 2)) * 40 + 20
    elif kind == "integer":  # exact ties, identical and touching boxes
        xy = rng.integers(0, 20, (n, 2)).astype(np.float64)
        wh = rng.integers(0, 6, (n, 2)).astype(np.float64)
    elif kind == "mixed":  # a few huge boxes among small ones
        xy = rng.random((n, 2)) * 1000
        wh = rng.random((n, 2)) * 30 + 1
        wh[rng.random(n) < 0.1] *= 30
    else:  # "weird": inverted, NaN and infinite coordinates
        xy = rng.normal(0, 100, (n, 2))
        wh = rng.normal(20, 20, (n, 2))
    b = np.concatenate([xy, xy + wh], 1).astype(dt)
    if kind == "weird" and n > 3:
        b[rng.random((n, 4)) < 0.03] = np.nan
        b[rng.random((n, 4)) < 0.02] = np.inf
        b[rng.random((n, 4)) < 0.02] = -np.inf
    return b


def gen_scores(rng, n, dt, ties):
    if ties:
        s = rng.integers(0, 4, n).astype(dt) / 4
        s[rng.random(n) < 0.05] = np.nan
        s[rng.random(n) < 0.05] = -0.0
    else:
        s = rng.random(n).astype(dt)
    return s


def compare_nms(r, rng, quick):
    cases = 0
    sizes = [0, 1, 2, 17, 200, 2000] if quick else [0, 1, 2, 17, 200, 1000, 5000]
    thresholds = [0.5, 0.0, 0.3, 0.7, 1.0, -0.1, float("nan"), 1e-6]
    for dt in (np.float32, np.float64):
        for kind in ("uniform", "clustered", "integer", "mixed", "weird"):
            for n in sizes:
                ties = bool(rng.integers(0, 2))
                b = gen_boxes(rng, kind, n, dt)
                s = gen_scores(rng, n, dt, ties)
                pb, ps = r.save("boxes", b), r.save("scores", s)
                # Every threshold on small inputs, three on large ones.
                ths = thresholds if n <= 200 else [thresholds[0], thresholds[1], thresholds[int(rng.integers(2, len(thresholds)))]]
                for thr in ths:
                    got = r.call("nms", {"boxes": pb, "scores": ps, "iou_threshold": fmt_float(thr)})
                    cases += 1
                    if got is None:
                        continue
                    exp = tv_nms(torch.from_numpy(b), torch.from_numpy(s), thr).numpy()
                    if got.dtype != np.int64 or got.shape != exp.shape or not np.array_equal(got, exp):
                        first = next((i for i in range(min(len(got), len(exp))) if got[i] != exp[i]), None)
                        r.fail(f"nms {np.dtype(dt).name} {kind} n={n} thr={thr} ties={ties}: "
                               f"got {got.dtype}{got.shape}, expected {exp.shape}; first difference at {first}")
    return cases


# ---- conv2d --------------------------------------------------------------------

CONV_CASES = [
    # (N, C, H, W), (O, C/g, kH, kW), groups, stride, padding, dilation, bias
    ((2, 3, 9, 11), (4, 3, 3, 3), 1, (1, 1), (0, 0), (1, 1), True),
    ((1, 4, 8, 8), (6, 2, 3, 3), 2, (1, 1), (1, 1), (1, 1), False),
    ((2, 6, 10, 7), (6, 1, 3, 3), 6, (1, 1), (1, 1), (1, 1), True),     # depthwise
    ((2, 6, 10, 7), (12, 1, 3, 3), 6, (2, 2), (1, 1), (1, 1), True),    # depthwise x2
    ((1, 4, 12, 12), (8, 4, 3, 3), 1, (1, 1), (2, 2), (2, 2), True),    # dilation 2
    ((3, 5, 13, 9), (7, 5, 3, 2), 1, (2, 3), (1, 0), (1, 2), True),     # non-square
    ((2, 8, 7, 5), (16, 8, 1, 1), 1, (1, 1), (0, 0), (1, 1), True),     # 1x1 direct
    ((2, 8, 7, 5), (16, 4, 1, 1), 2, (1, 1), (0, 0), (1, 1), False),    # 1x1, groups
    ((2, 8, 7, 5), (16, 8, 1, 1), 1, (2, 2), (0, 0), (1, 1), False),    # 1x1 stride 2
    ((1, 3, 5, 5), (2, 3, 5, 5), 1, (1, 1), (0, 0), (1, 1), True),      # kernel = input
    ((1, 3, 5, 5), (2, 3, 5, 5), 1, (3, 3), (4, 4), (1, 1), True),      # large padding
    ((1, 3, 4, 6), (2, 3, 3, 3), 1, (7, 7), (0, 4), (1, 1), True),      # stride > size
    ((1, 3, 6, 6), (3, 3, 3, 3), 1, (1, 1), (5, 5), (3, 3), True),
    ((0, 3, 5, 5), (4, 3, 3, 3), 1, (1, 1), (0, 0), (1, 1), True),      # empty batch
    ((1, 2, 1, 1), (3, 2, 1, 1), 1, (1, 1), (0, 0), (1, 1), True),
    ((2, 32, 17, 19), (64, 8, 5, 3), 4, (2, 1), (2, 1), (1, 3), True),
    ((1, 16, 32, 32), (32, 16, 3, 3), 1, (1, 1), (1, 1), (1, 1), True),
    ((1, 3, 64, 64), (16, 3, 7, 7), 1, (2, 2), (3, 3), (1, 1), True),   # stem-like
    ((3, 8, 9), (5, 3, 3, 3), 1, (1, 2), (1, 1), (1, 1), False),        # unbatched
]


def random_conv_case(rng):
    g = int(rng.choice([1, 1, 2, 3]))
    cg, og = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    kh, kw = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    s = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    p = (int(rng.integers(0, 3)), int(rng.integers(0, 3)))
    d = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
    hmin = max(1, d[0] * (kh - 1) + 1 - 2 * p[0])
    wmin = max(1, d[1] * (kw - 1) + 1 - 2 * p[1])
    h, w = int(rng.integers(hmin, hmin + 12)), int(rng.integers(wmin, wmin + 12))
    n = int(rng.integers(1, 3))
    return ((n, cg * g, h, w), (og * g, cg, kh, kw), g, s, p, d, bool(rng.integers(0, 2)))


def tolerance(exp, dt):
    scale = max(1.0, float(np.abs(exp).max())) if exp.size else 1.0
    return (1e-4 if dt == np.float32 else 1e-11) * scale


def compare_conv2d(r, rng, quick, worst):
    cases = 0
    nrand = 20 if quick else 60
    for dt in (np.float32, np.float64):
        configs = list(CONV_CASES) + [random_conv_case(rng) for _ in range(nrand)]
        for xs, ws, g, s, p, d, has_bias in configs:
            x = rng.standard_normal(xs).astype(dt)
            w = rng.standard_normal(ws).astype(dt)
            b = rng.standard_normal(ws[0]).astype(dt) if has_bias else None
            args = {"input": r.save("input", x), "weight": r.save("weight", w),
                    "stride": f"{s[0]},{s[1]}", "padding": f"{p[0]},{p[1]}",
                    "dilation": f"{d[0]},{d[1]}", "groups": str(g)}
            if b is not None:
                args["bias"] = r.save("bias", b)
            got = r.call("conv2d", args)
            cases += 1
            if got is None:
                continue
            exp = F.conv2d(torch.from_numpy(x), torch.from_numpy(w),
                           None if b is None else torch.from_numpy(b), s, p, d, g).numpy()
            desc = f"conv2d {np.dtype(dt).name} x{xs} w{ws} groups={g} stride={s} padding={p} dilation={d} bias={has_bias}"
            if got.dtype != exp.dtype or got.shape != exp.shape:
                r.fail(f"{desc}: got {got.dtype}{got.shape}, expected {exp.dtype}{exp.shape}")
                continue
            err = float(np.abs(got - exp).max()) if exp.size else 0.0
            worst[np.dtype(dt).name] = max(worst[np.dtype(dt).name], err)
            if not err <= tolerance(exp, dt):
                r.fail(f"{desc}: max abs error {err:g}")
    return cases


# ---- mm -------------------------------------------------------------------------

MM_SHAPES = [(1, 1, 1), (3, 4, 5), (5, 1, 7), (64, 128, 33), (129, 65, 257), (1, 300, 1),
             (0, 3, 4), (3, 0, 4), (3, 4, 0), (0, 0, 0), (500, 200, 300), (17, 31, 1)]


def compare_mm(r, rng, worst):
    cases = 0
    for dt in (np.float32, np.float64):
        for n, k, m in MM_SHAPES:
            a = rng.standard_normal((n, k)).astype(dt)
            b = rng.standard_normal((k, m)).astype(dt)
            got = r.call("mm", {"self": r.save("a", a), "mat2": r.save("b", b)})
            cases += 1
            if got is None:
                continue
            exp = torch.mm(torch.from_numpy(a), torch.from_numpy(b)).numpy()
            desc = f"mm {np.dtype(dt).name} [{n},{k}]x[{k},{m}]"
            if got.dtype != exp.dtype or got.shape != exp.shape:
                r.fail(f"{desc}: got {got.dtype}{got.shape}, expected {exp.dtype}{exp.shape}")
                continue
            err = float(np.abs(got - exp).max()) if exp.size else 0.0
            worst[np.dtype(dt).name] = max(worst[np.dtype(dt).name], err)
            if not err <= tolerance(exp, dt):
                r.fail(f"{desc}: max abs error {err:g}")
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", default=os.environ.get("OPJIT_CLI", "opjit"))
    ap.add_argument("--tmp", default=os.environ.get("OPJIT_TEST_TMP", "/tmp/opjit-compare"))
    ap.add_argument("--label", default="", help="a name for this run in the summary")
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--quick", action="store_true", help="fewer cases")
    opt = ap.parse_args()
    os.makedirs(opt.tmp, exist_ok=True)

    r = Runner(opt.cli, opt.tmp)
    rng = np.random.default_rng(opt.seed)
    label = f"[{opt.label}] " if opt.label else ""
    print(f"{label}torch {torch.__version__}, torchvision {torchvision.__version__}, cli {opt.cli}")

    before = len(r.failures)
    n = compare_nms(r, rng, opt.quick)
    print(f"{label}nms: {n} cases vs torchvision.ops.nms, {n - (len(r.failures) - before)} exact")

    worst = {"float32": 0.0, "float64": 0.0}
    before = len(r.failures)
    n = compare_conv2d(r, rng, opt.quick, worst)
    print(f"{label}conv2d: {n} cases vs F.conv2d, {len(r.failures) - before} failed; "
          f"max abs error float32 {worst['float32']:.3g}, float64 {worst['float64']:.3g}")

    worst = {"float32": 0.0, "float64": 0.0}
    before = len(r.failures)
    n = compare_mm(r, rng, worst)
    print(f"{label}mm: {n} cases vs torch.mm, {len(r.failures) - before} failed; "
          f"max abs error float32 {worst['float32']:.3g}, float64 {worst['float64']:.3g}")

    for f in r.failures[:50]:
        print("FAIL", f, file=sys.stderr)
    if r.failures:
        print(f"{label}{len(r.failures)} failures in {r.count} calls", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
