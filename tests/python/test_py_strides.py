"""conv2d and mm take what torch takes: tensors of any strides (transposed
views, x[..., ::2], channels_last, expand's zero strides, as_strided), and
conv2d.padding takes padding="same" / "valid" (a str argument), refusing
what F.conv2d refuses with its words. Against torch, on torch tensors."""
import unittest

import opjit
from opjit_testing import F, need_torch, runtime, torch


@need_torch
class TestStrides(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = runtime()
        cls.conv = cls.rt.load_op("conv2d")
        cls.conv_pad = cls.rt.load_op("conv2d.padding")
        cls.mm = cls.rt.load_op("mm")

    def views(self, t):
        """t and views of the same values in other layouts."""
        yield "contiguous", t
        if t.dim() == 4:
            yield "channels_last", t.to(memory_format=torch.channels_last)
        yield "transposed storage", t.transpose(-1, -2).contiguous().transpose(-1, -2)
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
        wide[..., ::2] = t
        yield "[..., ::2]", wide[..., ::2]
        big = torch.zeros(*[s + 2 for s in t.shape], dtype=t.dtype)
        big[(slice(1, -1),) * t.dim()] = t
        yield "a slice of a larger tensor", big[(slice(1, -1),) * t.dim()]

    def test_conv2d_any_strides(self):
        torch.manual_seed(0)
        for dtype in (torch.float32, torch.float64):
            x = torch.randn(2, 6, 9, 11, dtype=dtype)
            w = torch.randn(8, 3, 3, 3, dtype=dtype)
            b = torch.randn(8, dtype=dtype)
            want = F.conv2d(x, w, b, 1, 1, 1, 2)
            for (xn, xv), (wn, wv) in zip(self.views(x), self.views(w)):
                with self.subTest(dtype=dtype, x=xn, w=wn):
                    torch.testing.assert_close(self.conv(xv, wv, b, 1, 1, 1, 2), want)
            # expand: one image broadcast along the batch, one weight along O
            xe = x[:1].expand(3, -1, -1, -1)
            we = w[:1].expand(8, -1, -1, -1)
            torch.testing.assert_close(self.conv(xe, we, b[:1].expand(8), 1, 1, 1, 2),
                                       F.conv2d(xe.contiguous(), we.contiguous(),
                                                b[:1].expand(8).contiguous(), 1, 1, 1, 2))

    def test_mm_any_strides(self):
        torch.manual_seed(1)
        a, b = torch.randn(33, 20), torch.randn(20, 17)
        want = a @ b
        for (an, av), (bn, bv) in zip(self.views(a), self.views(b)):
            with self.subTest(a=an, b=bn):
                torch.testing.assert_close(self.mm(av, bv), want)
        row = torch.randn(1, 20)
        torch.testing.assert_close(self.mm(row.expand(33, 20), b), row.expand(33, 20) @ b)
        base = torch.randn(40)
        strided = torch.as_strided(base, (10, 20), (1, 1))  # overlapping windows
        torch.testing.assert_close(self.mm(strided, b), strided @ b)
        c = torch.randn(40, 34)[::2, ::2]  # strides (68, 2): neither layout BLAS reads
        torch.testing.assert_close(self.mm(a, c), a @ c)

    def test_padding_strings(self):
        torch.manual_seed(2)
        for k, dilation in (((3, 3), 1), ((2, 2), 1), ((4, 3), (1, 2)), ((2, 5), (3, 1))):
            x = torch.randn(2, 4, 10, 9)
            w = torch.randn(6, 2, *k)
            for padding in ("same", "valid"):
                with self.subTest(k=k, dilation=dilation, padding=padding):
                    want = F.conv2d(x, w, None, 1, padding, dilation, 2)
                    got = self.conv_pad(x, w, None, 1, padding, dilation, 2)
                    torch.testing.assert_close(got, want)
                    got = self.conv_pad(x, w, padding=padding, dilation=dilation, groups=2)
                    torch.testing.assert_close(got, want)
        x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
        torch.testing.assert_close(self.conv_pad(x, w), F.conv2d(x, w, padding="valid"))

    def test_refusals_use_torchs_words(self):
        x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
        for kwargs, words in ((dict(padding="foo"), "Invalid padding string: 'foo'"),
                              (dict(padding="same", stride=2),
                               "padding='same' is not supported for strided convolutions"),
                              (dict(padding="same", stride=(1, 2)),
                               "padding='same' is not supported for strided convolutions")):
            with self.subTest(kwargs=kwargs):
                with self.assertRaises(RuntimeError) as torch_raised:
                    F.conv2d(x, w, **kwargs)
                self.assertIn(words, str(torch_raised.exception))
                with self.assertRaisesRegex(opjit.Error, words.replace("(", r"\(")):
                    self.conv_pad(x, w, **kwargs)
        with self.assertRaisesRegex(opjit.Error, "expected str"):
            self.conv_pad(x, w, padding=1)
        with self.assertRaisesRegex(opjit.Error, "NUL"):
            self.conv_pad(x, w, padding="sa\0me")
        with self.assertRaisesRegex(opjit.Error, "expected input with 3 channels, but got 2"):
            self.conv(x, torch.randn(3, 3, 3, 3))


if __name__ == "__main__":
    unittest.main()
