"""float16 and bfloat16 on a CUDA GPU: mm, mm_backward, conv2d and
conv2d_backward on tensor cores (cublasGemmEx, cuDNN with 16-bit
descriptors, as torch runs them by default) and on the widened float32
path ($OPJIT_MM_KERNEL=wide, $OPJIT_CUDNN_HALF=wide), against a float64
reference and against torch's own 16-bit result on the same inputs.

The criteria (issue #22): opjit's error against float64 is no larger than
torch's (within a factor 1.5 and one unit of the dtype at the result's
scale: the two may pick different cuBLAS/cuDNN algorithms), and opjit's
result is close to torch's with torch's tolerance for the dtype scaled by
the reduction length. $OPJIT_CUDNN_HALF=tensor and the cuBLAS path
(OPJIT_MM_KERNEL=cublas) are demanded once, so a silent fallback to the
widened path cannot pass for the tensor-core one.

Skipped without a GPU (torch.cuda.is_available()); scripts/gpu-check runs
it on a machine with one and prints its timings (OPJIT_HALF_GPU_TIMES=1)."""
import os
import time
import unittest

from opjit_testing import F, runtime, torch

HAVE_GPU = torch is not None and torch.cuda.is_available()
# torch.testing's default rtol for the dtype
RTOL = {"float16": 1e-3, "bfloat16": 1.6e-2}
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
MODES = {"tensor": {"OPJIT_MM_KERNEL": "cublas", "OPJIT_CUDNN_HALF": "tensor"},
         "wide": {"OPJIT_MM_KERNEL": "wide", "OPJIT_CUDNN_HALF": "wide"}}


def err(got, ref):
    return float((got.double() - ref).abs().max() / (ref.abs().max() + 1e-30))


def mode_env(mode):
    for k, v in MODES[mode].items():
        os.environ[k] = v


def clear_env():
    for k in ("OPJIT_MM_KERNEL", "OPJIT_CUDNN_HALF"):
        os.environ.pop(k, None)


@unittest.skipUnless(HAVE_GPU, "no CUDA GPU for torch")
class TestHalfGpu(unittest.TestCase):  # pragma: no cover - needs a GPU
    @classmethod
    def setUpClass(cls):
        cls.rt = runtime()
        cls.ops = {n: cls.rt.load_op(n) for n in ("mm", "mm_backward", "conv2d",
                                                   "conv2d_backward")}

    def tearDown(self):
        clear_env()

    def check(self, what, dtype, k, got, want, ref):
        """got (opjit) and want (torch) against the float64 ref."""
        eo, et = err(got, ref), err(want, ref)
        self.assertEqual(got.dtype, want.dtype, what)
        self.assertLessEqual(eo, 1.5 * et + EPS[dtype], "%s: opjit %.3g, torch %.3g" %
                             (what, eo, et))
        scale = float(ref.abs().max())
        torch.testing.assert_close(got.double(), want.double(),
                                   rtol=RTOL[dtype] * max(1.0, k ** 0.5),
                                   atol=EPS[dtype] * scale * max(1.0, k ** 0.5) / 16,
                                   msg=lambda m: "%s: %s" % (what, m))

    def inputs(self, dtype, *shapes, adversarial=False):
        g = torch.Generator(device="cuda").manual_seed(sum(sum(s) for s in shapes))
        out = []
        for s in shapes:
            t = torch.randn(*s, device="cuda", generator=g)
            if adversarial:  # large and small magnitudes together, within the dtype's range
                big = 1e3 if dtype == "float16" else 1e15
                r = torch.rand(*s, device="cuda", generator=g)
                t = torch.where(r < 0.05, t * big, t)
                t = torch.where(r > 0.95, t * 1e-3, t)
            out.append(t.to(getattr(torch, dtype)))
        return out

    def test_mm(self):
        mm, mm_bw = self.ops["mm"], self.ops["mm_backward"]
        for mode in MODES:
            for dtype in ("float16", "bfloat16"):
                for n, k, m in ((64, 64, 64), (257, 129, 65), (1024, 1024, 1024)):
                    for adv in (False, True):
                        a, b, gy = self.inputs(dtype, (n, k), (k, m), (n, m), adversarial=adv)
                        what = "mm %s %s %dx%dx%d adv %s" % (mode, dtype, n, k, m, adv)
                        mode_env(mode)
                        got = mm(a, b)
                        gx, gw = mm_bw(gy, a, b)
                        gt = mm(a.t().contiguous().t(), b)  # a transposed view
                        clear_env()
                        self.check(what, dtype, k, got, torch.mm(a, b), a.double() @ b.double())
                        self.check(what + " self^T view", dtype, k, gt, torch.mm(a, b),
                                   a.double() @ b.double())
                        self.check(what + " grad_self", dtype, m, gx, gy.mm(b.t()),
                                   gy.double() @ b.double().t())
                        self.check(what + " grad_mat2", dtype, n, gw, a.t().mm(gy),
                                   a.double().t() @ gy.double())

    def test_conv2d(self):
        conv, conv_bw = self.ops["conv2d"], self.ops["conv2d_backward"]
        cases = [(8, 64, 56, 64, 3, 1, 1), (8, 256, 56, 64, 1, 1, 0), (2, 16, 20, 24, 3, 2, 1),
                 (1, 512, 7, 2048, 1, 1, 0)]
        for mode in MODES:
            for dtype in ("float16", "bfloat16"):
                for n, c, hw, o, k, s, p in cases:
                    x, w, bias = self.inputs(dtype, (n, c, hw, hw), (o, c, k, k), (o,))
                    w = w * (1.0 / (c * k * k)) ** 0.5
                    y = F.conv2d(x, w, bias, s, p)
                    gy, = self.inputs(dtype, tuple(y.shape))
                    what = "conv2d %s %s %s" % (mode, dtype, (n, c, hw, o, k, s, p))
                    mode_env(mode)
                    got = conv(x, w, bias, s, p)
                    dx, dw, db = conv_bw(gy, x, w, bias, s, p, 1, 1, [1, 1, 1])
                    clear_env()
                    xd, wd, bd = x.double().requires_grad_(), w.double().requires_grad_(), \
                        bias.double().requires_grad_()
                    ref = F.conv2d(xd, wd, bd, s, p)
                    rdx, rdw, rdb = torch.autograd.grad(ref, (xd, wd, bd), gy.double())
                    xt, wt, bt = (t.detach().clone().requires_grad_() for t in (x, w, bias))
                    tdx, tdw, tdb = torch.autograd.grad(F.conv2d(xt, wt, bt, s, p), (xt, wt, bt),
                                                        gy)
                    kk = c * k * k
                    self.check(what, dtype, kk, got, y, ref.detach())
                    self.check(what + " grad_input", dtype, o * k * k, dx, tdx, rdx)
                    self.check(what + " grad_weight", dtype, n * y.shape[2] * y.shape[3], dw,
                               tdw, rdw)
                    self.check(what + " grad_bias", dtype, n * y.shape[2] * y.shape[3], db, tdb,
                               rdb)

    def test_times(self):
        """Information: the tensor-core path, the widened one and torch."""
        if os.environ.get("OPJIT_HALF_GPU_TIMES") != "1":
            self.skipTest("OPJIT_HALF_GPU_TIMES=1 prints the timings")
        mm, conv = self.ops["mm"], self.ops["conv2d"]

        def t(fn, reps=20):
            fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) / reps * 1e3
        for dtype in ("float16", "bfloat16"):
            a, b = self.inputs(dtype, (4096, 4096), (4096, 4096))
            x, w = self.inputs(dtype, (32, 64, 56, 56), (64, 64, 3, 3))
            row = {}
            for mode in MODES:
                mode_env(mode)
                row[mode] = (t(lambda: mm(a, b)), t(lambda: conv(x, w, None, 1, 1)))
                clear_env()
            row["torch"] = (t(lambda: torch.mm(a, b)), t(lambda: F.conv2d(x, w, None, 1, 1)))
            print("half gpu %s: mm 4096 ms (tensor, wide, torch) %s; conv2d 3x3 64 @56 b32 %s"
                  % (dtype, ["%.3f" % row[m][0] for m in ("tensor", "wide", "torch")],
                     ["%.3f" % row[m][1] for m in ("tensor", "wide", "torch")]))


if __name__ == "__main__":
    unittest.main()
