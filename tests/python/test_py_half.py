"""float16 and bfloat16 through the Python front: nms takes half boxes and
scores and keeps exactly what torchvision keeps for the same values in
float32 (the IoU in float32, as torchvision's CUDA kernel computes it for
half; its CPU kernel takes no half). mm, conv2d, conv2d.padding and their
backward ops take half tensors in both tiers and give torch's float32
result on the same values, rounded to the dtype, within a unit in the last
place (torch 1.13's CPU has no float16 conv2d or mm; where it has a
bfloat16 one, that agrees too)."""
import os
import unittest

import opjit
from opjit_testing import (F, need_torch, need_torchvision, random_boxes, runtime, torch,
                           torchvision)


@need_torch
@need_torchvision
class TestHalfNms(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.nms = runtime().load_op("nms")

    def test_half_boxes_keep_what_float32_keeps(self):
        seed = 0
        for dtype in (torch.float16, torch.bfloat16):
            for n in (0, 1, 7, 300, 2000):
                for iou in (0.0, 0.3, 0.5, 0.9):
                    seed += 1
                    b, s = random_boxes(n, seed, "float32", ties=seed % 3 == 0)
                    b, s = torch.from_numpy(b).to(dtype), torch.from_numpy(s).to(dtype)
                    got = self.nms(b, s, iou)
                    want = torchvision.ops.nms(b.float(), s.float(), iou)
                    self.assertEqual(got.dtype, torch.int64)
                    self.assertTrue(torch.equal(got, want), (dtype, n, iou))

    def test_mixed_dtypes_are_refused(self):
        b, s = random_boxes(5, 1, "float32")
        with self.assertRaisesRegex(Exception, "scores dtype .float32. must match boxes dtype .float16."):
            self.nms(torch.from_numpy(b).half(), torch.from_numpy(s), 0.5)


# (n, c, h, w, o, k, stride, padding, groups)
CONV_CASES = [
    (2, 3, 9, 11, 4, 3, 1, 0, 1),
    (2, 16, 14, 14, 24, 3, 1, 1, 1),   # Winograd in the optimizing tier
    (1, 8, 13, 13, 6, 3, 2, 1, 2),
    (2, 8, 7, 5, 16, 1, 1, 0, 1),
    (0, 3, 5, 5, 4, 3, 1, 0, 1),
]


class HalfOpsTests:
    """The test bodies; subclasses pick the tier."""
    rt = None

    @classmethod
    def op(cls, name):
        return cls.rt.load_op(name)

    def close(self, got, want_f32, dtype, what):
        """got (dtype) is want_f32 rounded to dtype, give or take a unit in
        the last place (the float32 sums run in another order)."""
        self.assertEqual(got.dtype, dtype, what)
        eps = 2.0 ** -10 if dtype == torch.float16 else 2.0 ** -7
        torch.testing.assert_close(got.float(), want_f32.to(dtype).float(), rtol=2 * eps,
                                   atol=4 * eps, msg=what)

    def test_mm_and_its_gradients(self):
        mm, mm_bw = self.op("mm"), self.op("mm_backward")
        torch.manual_seed(0)
        for dtype in (torch.float16, torch.bfloat16):
            for n, k, m in ((1, 1, 1), (37, 53, 29), (128, 256, 64), (0, 3, 4), (3, 0, 4)):
                a, b = torch.randn(n, k).to(dtype), torch.randn(k, m).to(dtype)
                gy = torch.randn(n, m).to(dtype)
                what = (dtype, n, k, m)
                self.close(mm(a, b), a.float() @ b.float(), dtype, what)
                ga, gb = mm_bw(gy, a, b)
                self.close(ga, gy.float() @ b.float().t(), dtype, what)
                self.close(gb, a.float().t() @ gy.float(), dtype, what)
            # a transposed view and a strided one, as torch.mm takes them
            a, b = torch.randn(40, 30).to(dtype).t(), torch.randn(80, 50).to(dtype)[::2, ::2]
            self.close(mm(a, b), a.float() @ b.float(), dtype, "views")
        # torch's own bfloat16 mm on the CPU agrees within its rounding
        a, b = torch.randn(64, 96).bfloat16(), torch.randn(96, 48).bfloat16()
        torch.testing.assert_close(mm(a, b).float(), torch.mm(a, b).float(), rtol=2 ** -6,
                                   atol=2 ** -5)

    def test_conv2d_and_its_gradients(self):
        conv, conv_bw = self.op("conv2d"), self.op("conv2d_backward")
        torch.manual_seed(1)
        for dtype in (torch.float16, torch.bfloat16):
            for n, c, h, w, o, k, stride, padding, groups in CONV_CASES:
                x = torch.randn(n, c, h, w).to(dtype)
                wt = (torch.randn(o, c // groups, k, k) / k).to(dtype)
                b = torch.randn(o).to(dtype)
                what = (dtype, n, c, h, w, o, k, stride, padding, groups)
                xf, wf, bf = x.float().requires_grad_(), wt.float().requires_grad_(), \
                    b.float().requires_grad_()
                yf = F.conv2d(xf, wf, bf, stride, padding, 1, groups)
                self.close(conv(x, wt, b, stride, padding, 1, groups), yf.detach(), dtype, what)
                gy = torch.randn_like(yf).to(dtype)
                if n:
                    yf.backward(gy.float())
                got = conv_bw(gy, x, wt, b, stride, padding, 1, groups)
                want = (xf.grad, wf.grad, bf.grad) if n else \
                    (torch.zeros_like(xf), torch.zeros_like(wf), torch.zeros_like(bf))
                for g, wg in zip(got, want):
                    self.close(g, wg.detach(), dtype, what)
            # channels_last input and the string padding
            x = torch.randn(2, 4, 12, 11).to(dtype).to(memory_format=torch.channels_last)
            wt = torch.randn(6, 4, 3, 3).to(dtype)
            y = self.op("conv2d.padding")(x, wt, None, 1, "same")
            self.close(y, F.conv2d(x.float(), wt.float(), None, 1, "same"), dtype, "same")
            gy = torch.randn_like(y)
            xf, wf = x.float().requires_grad_(), wt.float().requires_grad_()
            F.conv2d(xf, wf, None, 1, "same").backward(gy.float())
            gi, gw, _ = self.op("conv2d_backward.padding")(gy, x, wt, None, 1, "same")
            self.close(gi, xf.grad, dtype, "same grad_input")
            self.close(gw, wf.grad, dtype, "same grad_weight")

    def test_error_no_larger_than_torchs(self):
        """bfloat16 mm and conv2d on random and adversarial inputs (large
        and tiny magnitudes, subnormals, an infinity): each element's error
        against a float64 reference, over the sum of its terms' magnitudes,
        at most torch's largest (plus a unit of the dtype), over the finite
        reference values; and the same NaN and infinities as the reference
        wherever torch has them. (The widened path's Winograd used to be
        1e7 times off here.)"""
        conv, mm = self.op("conv2d"), self.op("mm")
        g = torch.Generator().manual_seed(7)

        def inputs(*shapes, kind):
            out = []
            for i, shape in enumerate(shapes):
                t = torch.randn(*shape, generator=g)
                if kind:
                    r = torch.rand(*shape, generator=g)
                    t = torch.where(r < 0.06, t * 1e15, t)
                    t = torch.where(r > 0.94, t * 1e-39, t)  # bfloat16 subnormals
                    if kind == 2 and i == 0:
                        t.view(-1)[t.numel() // 2] = float("inf")
                out.append(t.bfloat16())
            return out

        def err(got, ref, mag):
            fin = torch.isfinite(ref) & torch.isfinite(mag)
            e = ((got.double() - ref).abs() / mag.clamp_min(1e-300))[fin]
            return (float(e.max()) if e.numel() else 0.0), ~torch.isfinite(ref)

        for kind in (0, 1, 2):
            cases = []
            a, b = inputs((48, 96), (96, 40), kind=kind)
            cases.append(("mm", mm(a, b), torch.mm(a, b), a.double() @ b.double(),
                          a.double().abs() @ b.double().abs()))
            for c, o, k, s, p in ((16, 24, 3, 1, 1), (8, 12, 3, 2, 1), (32, 40, 1, 1, 0)):
                x, w = inputs((2, c, 14, 14), (o, c, k, k), kind=kind)
                cases.append(("conv2d %dx%d c%d" % (k, k, c), conv(x, w, None, s, p),
                              F.conv2d(x, w, None, s, p),
                              F.conv2d(x.double(), w.double(), None, s, p),
                              F.conv2d(x.double().abs(), w.double().abs(), None, s, p)))
            # grad_input of a 3x3, stride 1: a convolution of the gradient
            x, w, gy = inputs((2, 16, 14, 14), (24, 16, 3, 3), (2, 24, 14, 14), kind=kind)
            xt = x.clone().requires_grad_()
            tgi, = torch.autograd.grad(F.conv2d(xt, w, None, 1, 1), xt, gy)
            xd = x.double().requires_grad_()
            rgi, = torch.autograd.grad(F.conv2d(xd, w.double(), None, 1, 1), xd, gy.double())
            gyabs = gy.double().abs()
            xa = x.double().abs().requires_grad_()
            mgi, = torch.autograd.grad(F.conv2d(xa, w.double().abs(), None, 1, 1), xa, gyabs)
            cases.append(("conv2d_backward grad_input 3x3", self.op("conv2d_backward")(
                gy, x, w, None, 1, 1, 1, 1, [1, 0, 0])[0], tgi, rgi, mgi))
            # grad_weight: an even width, an odd one (the infinity, in x, must
            # not meet the zeros of padded positions), a 1x1
            for hw, k, p in ((14, 3, 1), (13, 3, 1), (7, 1, 0)):
                x, w, gy = inputs((2, 16, hw, hw), (24, 16, k, k), (2, 24, hw, hw), kind=kind)
                wt = w.clone().requires_grad_()
                tgw, = torch.autograd.grad(F.conv2d(x, wt, None, 1, p), wt, gy)
                wd = w.double().requires_grad_()
                rgw, = torch.autograd.grad(F.conv2d(x.double(), wd, None, 1, p), wd,
                                           gy.double())
                wa = w.double().abs().requires_grad_()
                mgw, = torch.autograd.grad(F.conv2d(x.double().abs(), wa, None, 1, p), wa,
                                           gy.double().abs())
                cases.append(("conv2d_backward grad_weight %dx%d @%d" % (k, k, hw),
                              self.op("conv2d_backward")(gy, x, w, None, 1, p, 1, 1,
                                                         [0, 1, 0])[1], tgw, rgw, mgw))
            for what, got, want, ref, mag in cases:
                what = "%s adversarial %d" % (what, kind)
                eo, nonfin = err(got, ref, mag)
                et, _ = err(want, ref, mag)
                self.assertLessEqual(eo, et + 2.0 ** -8, "%s: opjit %.3g, torch %.3g"
                                     % (what, eo, et))
                same = want.double()[nonfin].nan_to_num(0.5) == ref[nonfin].nan_to_num(0.5)
                mine = got.double()[nonfin].nan_to_num(0.5) == ref[nonfin].nan_to_num(0.5)
                self.assertTrue(bool((mine | ~same).all()), what)

    def test_mixed_dtypes_are_refused_as_torch_refuses_them(self):
        conv, mm = self.op("conv2d"), self.op("mm")
        x, wt = torch.randn(1, 2, 5, 5).half(), torch.randn(3, 2, 3, 3)
        with self.assertRaisesRegex(opjit.Error, r"Input type \(c10::Half\) and weight type "
                                                 r"\(float\) should be the same"):
            conv(x, wt)
        with self.assertRaisesRegex(opjit.Error, r"mat2 dtype \(bfloat16\) must match self "
                                                 r"dtype \(float16\)"):
            mm(torch.randn(2, 3).half(), torch.randn(3, 2).bfloat16())


@need_torch
class TestHalfOpsTcc(HalfOpsTests, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = runtime()


@need_torch
class TestHalfOpsOptimized(HalfOpsTests, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = runtime(tiering=True)
        cls.op("mm"), cls.op("conv2d")
        cls.rt.wait()
        if cls.rt.load_op("conv2d").tier != "opt":
            raise unittest.SkipTest("the optimizing tier is not in use (no C compiler?)")


def amx_here():
    """Whether this CPU has the AMX tiles gemm_half.h uses (Linux's flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((l for l in f if l.startswith("flags")), "").split())
    except OSError:
        return False
    return {"amx_tile", "amx_bf16", "avx512_bf16"} <= flags


@need_torch
class TestHalfOpsAmx(HalfOpsTests, unittest.TestCase):
    """The same with bfloat16's AMX kernels forced ($OPJIT_HALF_KERNEL=amx:
    every bfloat16 operand on the tiles, subnormals counted as zero as
    torch's oneDNN kernels count them), where the CPU has them."""
    @classmethod
    def setUpClass(cls):
        if not amx_here():
            raise unittest.SkipTest("no AMX here (amx_tile, amx_bf16): the AMX kernels are "
                                    "not checked")
        cls.rt = runtime(tiering=True)
        cls.op("mm"), cls.op("conv2d")
        cls.rt.wait()
        if cls.rt.load_op("conv2d").tier != "opt":
            raise unittest.SkipTest("the optimizing tier is not in use (no C compiler?)")
        cls.saved = os.environ.get("OPJIT_HALF_KERNEL")
        os.environ["OPJIT_HALF_KERNEL"] = "amx"  # read at each call

    @classmethod
    def tearDownClass(cls):
        if cls.saved is None:
            os.environ.pop("OPJIT_HALF_KERNEL", None)
        else:
            os.environ["OPJIT_HALF_KERNEL"] = cls.saved


if __name__ == "__main__":
    unittest.main()
