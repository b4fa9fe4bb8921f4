"""The shipped backward ops (conv2d_backward, conv2d_backward.padding,
mm_backward) called from Python on torch tensors, against the gradients
torch computes: torch.nn.grad.conv2d_input / conv2d_weight, and autograd
through F.conv2d and torch.mm. Both tiers (libtcc, and the optimizing tier
when a C compiler is there), float32 and float64, every output_mask."""
import itertools
import unittest

import opjit
from opjit_testing import F, need_torch, runtime, torch

# (n, c, h, w, o, k, stride, padding, dilation, groups, bias)
CONV_CASES = [
    (2, 3, 9, 11, 4, (3, 3), 1, 0, 1, 1, True),
    (1, 4, 8, 8, 6, (3, 3), 1, 1, 1, 2, False),
    (2, 6, 10, 7, 12, (3, 3), 1, 1, 1, 6, True),      # depthwise x2
    (1, 4, 12, 12, 8, (3, 3), 1, 2, 2, 1, True),      # dilation 2
    (3, 5, 13, 9, 7, (3, 2), (2, 3), (1, 0), (1, 2), 1, True),
    (2, 8, 7, 5, 16, (1, 1), 1, 0, 1, 1, True),       # 1x1
    (2, 8, 7, 5, 16, (1, 1), 2, 0, 1, 1, False),      # 1x1 stride 2
    (1, 3, 5, 5, 2, (5, 5), 3, 4, 1, 1, True),        # padding above k - 1
    (1, 3, 28, 28, 8, (7, 7), 2, 3, 1, 1, True),      # stem-like
    (4, 16, 14, 14, 24, (3, 3), 1, 1, 1, 1, True),    # Winograd (optimizing tier)
    (0, 3, 5, 5, 4, (3, 3), 1, 0, 1, 1, True),        # empty batch
    (2, 0, 5, 5, 4, (3, 3), 1, 1, 1, 1, True),        # no input channels
]


def torch_grads(x, w, b, gy, stride, padding, dilation, groups):
    """grad_input, grad_weight and grad_bias as torch computes them."""
    if x.shape[1] == 0:  # no input channels: nothing to differentiate but the bias
        return torch.zeros_like(x), torch.zeros_like(w), gy.sum((0, 2, 3))
    if x.numel() == 0:  # torch.nn.grad needs data; autograd does not
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        br = b.clone().requires_grad_() if b is not None else None
        F.conv2d(xr, wr, br, stride, padding, dilation, groups).backward(gy)
        gb = br.grad if br is not None else None
        return (xr.grad if xr.grad is not None else torch.zeros_like(x),
                wr.grad if wr.grad is not None else torch.zeros_like(w), gb)
    gi = torch.nn.grad.conv2d_input(x.shape, w, gy, stride, padding, dilation, groups)
    gw = torch.nn.grad.conv2d_weight(x, w.shape, gy, stride, padding, dilation, groups)
    return gi, gw, gy.sum((0, 2, 3)) if b is not None else None


class BackwardTests:
    """The test bodies; subclasses pick the tier."""
    rt = None

    @classmethod
    def ops(cls):
        return (cls.rt.load_op("conv2d_backward"), cls.rt.load_op("conv2d_backward.padding"),
                cls.rt.load_op("mm_backward"))

    def tol(self, dtype):
        return dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-10,
                                                                              atol=1e-10)

    def test_conv2d_backward_matches_torch(self):
        conv_bw, _, _ = self.ops()
        torch.manual_seed(0)
        for case, dtype in itertools.product(CONV_CASES, (torch.float32, torch.float64)):
            n, c, h, w, o, k, stride, padding, dilation, groups, bias = case
            with self.subTest(case=case, dtype=dtype):
                x = torch.randn(n, c, h, w, dtype=dtype)
                wt = torch.randn(o, c // groups, *k, dtype=dtype)
                b = torch.randn(o, dtype=dtype) if bias else None
                y = F.conv2d(x, wt, b, stride, padding, dilation, groups)
                if c == 0:  # torch gives [N, 0, ...] here; the output has o channels
                    y = torch.empty(n, o, h + 2 * padding - k[0] + 1, w + 2 * padding - k[1] + 1,
                                    dtype=dtype)
                gy = torch.randn_like(y)
                gi, gw, gb = conv_bw(gy, x, wt, b, stride, padding, dilation, groups)
                want = torch_grads(x, wt, b, gy, stride, padding, dilation, groups)
                torch.testing.assert_close(gi, want[0], **self.tol(dtype))
                torch.testing.assert_close(gw, want[1], **self.tol(dtype))
                if bias:
                    torch.testing.assert_close(gb, want[2], **self.tol(dtype))
                else:
                    self.assertEqual(tuple(gb.shape), (0,))

    def test_output_mask_and_strided_operands(self):
        conv_bw, _, _ = self.ops()
        torch.manual_seed(1)
        x = torch.randn(2, 6, 11, 10)
        wt = torch.randn(8, 3, 3, 3)
        b = torch.randn(8)
        gy = torch.randn(2, 8, 11, 10)
        want = torch_grads(x, wt, b, gy, 1, 1, 1, 2)
        for mask in itertools.product((0, 1), repeat=3):
            with self.subTest(mask=mask):
                got = conv_bw(gy, x, wt, b, 1, 1, 1, 2, output_mask=list(mask))
                for i in range(3):
                    if mask[i]:
                        torch.testing.assert_close(got[i], want[i], rtol=1e-4, atol=1e-4)
                    else:
                        self.assertEqual(tuple(got[i].shape), (0,))
        # channels_last grad and input, a transposed weight: the same gradients
        got = conv_bw(gy.to(memory_format=torch.channels_last),
                      x.to(memory_format=torch.channels_last),
                      wt.transpose(2, 3).contiguous().transpose(2, 3), b, 1, 1, 1, 2)
        for i in range(3):
            torch.testing.assert_close(got[i], want[i], rtol=1e-4, atol=1e-4)

    def test_padding_strings_match_autograd(self):
        _, conv_bw_pad, _ = self.ops()
        torch.manual_seed(2)
        for k, dilation, padding in itertools.product(((3, 3), (2, 2), (4, 3)), (1, 2),
                                                      ("same", "valid")):
            with self.subTest(k=k, dilation=dilation, padding=padding):
                x = torch.randn(2, 4, 12, 11, dtype=torch.float64, requires_grad=True)
                wt = torch.randn(6, 2, *k, dtype=torch.float64, requires_grad=True)
                b = torch.randn(6, dtype=torch.float64, requires_grad=True)
                y = F.conv2d(x, wt, b, 1, padding, dilation, 2)
                gy = torch.randn_like(y)
                y.backward(gy)
                got = conv_bw_pad(gy, x.detach(), wt.detach(), b.detach(), 1, padding, dilation,
                                  2)
                for g, want in zip(got, (x.grad, wt.grad, b.grad)):
                    torch.testing.assert_close(g, want, rtol=1e-10, atol=1e-10)
        with self.assertRaisesRegex(opjit.Error, "padding='same' is not supported for "
                                                 "strided convolutions"):
            conv_bw_pad(torch.randn(1, 1, 2, 2), torch.randn(1, 1, 4, 4),
                        torch.randn(1, 1, 3, 3), None, 2, "same")

    def test_mm_backward_matches_autograd(self):
        _, _, mm_bw = self.ops()
        torch.manual_seed(3)
        for (n, k, m), dtype in itertools.product(((1, 1, 1), (5, 7, 3), (64, 130, 33),
                                                   (0, 3, 4), (3, 0, 4)),
                                                  (torch.float32, torch.float64)):
            with self.subTest(n=n, k=k, m=m, dtype=dtype):
                a = torch.randn(n, k, dtype=dtype, requires_grad=True)
                b = torch.randn(k, m, dtype=dtype, requires_grad=True)
                gy = torch.randn(n, m, dtype=dtype)
                torch.mm(a, b).backward(gy)
                ga, gb = mm_bw(gy, a.detach(), b.detach())
                torch.testing.assert_close(ga, a.grad if a.grad is not None
                                           else torch.zeros_like(a), **self.tol(dtype))
                torch.testing.assert_close(gb, b.grad if b.grad is not None
                                           else torch.zeros_like(b), **self.tol(dtype))
        # transposed and strided operands, one gradient at a time
        a, b, gy = torch.randn(40, 30), torch.randn(60, 60), torch.randn(40, 25)
        a_t, b_s = a.t().contiguous().t(), b[::2, ::2][:, :25]
        ga, gb = mm_bw(gy, a_t, b_s, [1, 0])
        torch.testing.assert_close(ga, gy @ b_s.t(), rtol=1e-4, atol=1e-4)
        self.assertEqual(tuple(gb.shape), (0,))
        ga, gb = mm_bw(gy.t().contiguous().t(), a_t, b_s, output_mask=[0, 1])
        torch.testing.assert_close(gb, a_t.t() @ gy, rtol=1e-4, atol=1e-4)


@need_torch
class TestBackwardTcc(BackwardTests, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = runtime()


@need_torch
class TestBackwardOptimized(BackwardTests, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = runtime(tiering=True)
        cls.ops()
        cls.rt.wait()
        if cls.rt.load_op("conv2d_backward").tier != "opt":
            raise unittest.SkipTest("the optimizing tier is not in use (no C compiler?)")


if __name__ == "__main__":
    unittest.main()
