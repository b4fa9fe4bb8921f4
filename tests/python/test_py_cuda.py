"""The Python package on CUDA tensors: the shipped ops called on torch.cuda
tensors give what their CPU twins and torch/torchvision give (nms indices
identical, mm and conv2d and their gradients within float32 tolerance, on
cuDNN's graph and legacy APIs), run on torch's current stream between
other torch work, and as torch ops (register_torch) pass opjit's
torch.library.opcheck with CUDA samples, gradcheck in float64 on the
device and torch.compile(fullgraph=True) on CUDA inputs.

Needs torch with a CUDA GPU (scripts/gpu-check runs it there); skipped
elsewhere. OPJIT_PY_CUDA_TEST_DEVICE=cpu runs the same bodies on CPU
tensors, which checks the test itself on a machine without a GPU (the
stream test is then skipped)."""
import os
import unittest

import opjit
from opjit_testing import F, random_boxes, runtime, torch, torchvision

DEVICE = os.environ.get("OPJIT_PY_CUDA_TEST_DEVICE", "cuda")
HAVE_DEVICE = torch is not None and (DEVICE != "cuda" or torch.cuda.is_available())
TORCH2 = torch is not None and hasattr(torch.library, "opcheck")
NS = "opjit_cuda_t"
TOL = dict(rtol=1e-4, atol=1e-4)  # float32 sums of up to a few thousand terms

need_device = unittest.skipUnless(HAVE_DEVICE, "no CUDA GPU for torch")
need_torch2 = unittest.skipUnless(TORCH2, "needs torch >= 2.4 (the torch 2 virtual environment)")

_rt = None


def setUpModule():
    global _rt
    if not HAVE_DEVICE:
        return
    _rt = runtime()
    for name in ("nms", "mm", "conv2d"):
        op = _rt.load_op(name)
        if DEVICE not in op.devices:  # the device is here: its kernel must be too
            raise RuntimeError("%s has no %s kernel: %s" % (name, DEVICE, op.devices))
        opjit.register_torch(op, namespace=NS)
    torch.backends.cuda.matmul.allow_tf32 = False  # true float32, as the ops compute
    torch.backends.cudnn.allow_tf32 = False


def op(name):
    return _rt.load_op(name)


def tops():
    return getattr(torch.ops, NS)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def on(t):
    return t.to(DEVICE) if t is not None else None


def boxes(n, seed, dtype="float32"):
    b, s = random_boxes(n, seed, dtype)
    return torch.from_numpy(b), torch.from_numpy(s)


# (n, c, h, w, o, k, stride, padding, dilation, groups, bias)
CONV_CASES = [
    (2, 3, 17, 19, 8, (3, 3), 1, 1, 1, 1, True),
    (2, 4, 16, 16, 6, (3, 5), (2, 1), (2, 0), (1, 2), 2, True),
    (1, 8, 9, 9, 8, (3, 3), 1, 1, 1, 8, False),          # depthwise
    (3, 16, 8, 8, 32, (1, 1), 1, 0, 1, 1, True),         # 1x1
    (1, 3, 28, 28, 16, (7, 7), 2, 3, 1, 1, False),       # stem-like
    (8, 64, 14, 14, 64, (3, 3), 1, 1, 1, 1, True),       # ResNet-50-like
]


@need_device
class TestCalls(unittest.TestCase):
    """Direct calls (opjit.Op) on device tensors."""

    def tearDown(self):
        os.environ.pop("OPJIT_CUDNN_GRAPH", None)

    def test_nms_matches_the_cpu_twin_and_torchvision(self):
        nms = op("nms")
        for n, dtype, thr in ((2000, "float32", 0.5), (500, "float64", 0.3), (1, "float32", 0.5),
                              (300, "float16", 0.6)):
            b, s = boxes(n, n, "float32" if dtype == "float16" else dtype)
            if dtype == "float16":
                b, s = b.half(), s.half()
            got = nms(on(b), on(s), thr)
            self.assertEqual(got.device.type, DEVICE)
            self.assertEqual(got.dtype, torch.int64)
            self.assertTrue(torch.equal(got.cpu(), nms(b, s, thr)), (n, dtype))
            if torchvision is not None and dtype != "float16":  # CPU torchvision: no float16
                self.assertTrue(torch.equal(got.cpu(), torchvision.ops.nms(b, s, thr)), (n, dtype))

    def test_mm_matches_torch_and_the_cpu_twin(self):
        mm = op("mm")
        g = gen(1)
        for n, k, m in ((3, 4, 5), (128, 256, 64), (1, 7, 1), (0, 3, 2), (257, 129, 65)):
            for dtype in (torch.float32, torch.float64):
                a = torch.randn(n, k, dtype=dtype, generator=g)
                b = torch.randn(k, m, dtype=dtype, generator=g)
                got = mm(on(a), on(b))
                self.assertEqual(got.device.type, DEVICE)
                torch.testing.assert_close(got, torch.mm(on(a), on(b)), **TOL)
                torch.testing.assert_close(got.cpu(), mm(a, b), **TOL)
        a = torch.randn(64, 48, generator=g)
        torch.testing.assert_close(mm(on(a).t(), on(a)), on(a.t() @ a), **TOL)  # transposed

    def conv_cases(self):
        g = gen(2)
        for case in CONV_CASES:
            n, c, h, w, o, k, stride, pad, dil, groups, bias = case
            x = torch.randn(n, c, h, w, generator=g)
            wt = torch.randn(o, c // groups, *k, generator=g) / (c * k[0] * k[1]) ** 0.5
            b = torch.randn(o, generator=g) if bias else None
            yield case, x, wt, b, (stride, pad, dil, groups)

    def test_conv2d_matches_torch_and_the_cpu_twin_on_both_cudnn_apis(self):
        conv = op("conv2d")
        for api in ("1", "0"):
            os.environ["OPJIT_CUDNN_GRAPH"] = api
            for case, x, w, b, (stride, pad, dil, groups) in self.conv_cases():
                with self.subTest(case=case, graph_api=api):
                    got = conv(on(x), on(w), on(b), stride, pad, dil, groups)
                    self.assertEqual(got.device.type, DEVICE)
                    want = F.conv2d(on(x), on(w), on(b), stride, pad, dil, groups)
                    torch.testing.assert_close(got, want, **TOL)
                    torch.testing.assert_close(got.cpu(), conv(x, w, b, stride, pad, dil, groups),
                                               **TOL)
                    xl = on(x).contiguous(memory_format=torch.channels_last)
                    torch.testing.assert_close(conv(xl, on(w), on(b), stride, pad, dil, groups),
                                               want, **TOL)
        pad_op = _rt.load_op("conv2d::conv2d.padding")
        x, w = torch.randn(2, 4, 9, 10, generator=gen(3)), torch.randn(6, 4, 2, 2, generator=gen(4))
        torch.testing.assert_close(pad_op(on(x), on(w), None, 1, "same"),
                                   F.conv2d(on(x), on(w), None, 1, "same"), **TOL)

    def test_backward_ops_match_autograd_on_both_cudnn_apis(self):
        conv_bw, mm_bw = op("conv2d_backward"), op("mm_backward")
        for api in ("1", "0"):
            os.environ["OPJIT_CUDNN_GRAPH"] = api
            for case, x, w, b, (stride, pad, dil, groups) in self.conv_cases():
                with self.subTest(case=case, graph_api=api):
                    xr, wr = on(x).requires_grad_(), on(w).requires_grad_()
                    br = on(b).requires_grad_() if b is not None else None
                    y = F.conv2d(xr, wr, br, stride, pad, dil, groups)
                    gy = torch.randn_like(y)
                    y.backward(gy)
                    gi, gw, gb = conv_bw(gy, on(x), on(w), on(b), stride, pad, dil, groups)
                    torch.testing.assert_close(gi, xr.grad, **TOL)
                    torch.testing.assert_close(gw, wr.grad, **TOL)
                    if b is not None:
                        torch.testing.assert_close(gb, br.grad, **TOL)
        g = gen(5)
        a, b = torch.randn(96, 80, generator=g), torch.randn(80, 72, generator=g)
        gy = torch.randn(96, 72, generator=g)
        ga, gb = mm_bw(on(gy), on(a), on(b))
        torch.testing.assert_close(ga, on(gy @ b.t()), **TOL)
        torch.testing.assert_close(gb, on(a.t() @ gy), **TOL)

    @unittest.skipUnless(DEVICE == "cuda", "streams are CUDA's")
    def test_calls_run_on_torchs_current_stream_between_torch_work(self):
        """Inputs made by slow torch work on a side stream, the result used by
        torch work after it, no synchronisation between: opjit must queue on
        that stream, after what made its inputs and before what reads its
        output."""
        mm, conv = op("mm"), op("conv2d")
        g = gen(6)
        a0 = torch.randn(2048, 2048, generator=g) / 2048 ** 0.5
        x0 = torch.randn(8, 64, 56, 56, generator=g)
        w = torch.randn(64, 64, 3, 3, generator=g) / 24.0
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            a = on(a0)
            for _ in range(8):  # long enough that a call run elsewhere would read early
                a = torch.mm(a, a) * 0.5 + a
            x = on(x0) * 2.0
            got_mm = mm(a, a) + 1.0
            got_conv = conv(x, on(w), None, 1, 1).relu()
        with torch.cuda.stream(side):
            want_mm = torch.mm(a, a) + 1.0
            want_conv = F.conv2d(x, on(w), None, 1, 1).relu()
        torch.cuda.synchronize()
        torch.testing.assert_close(got_mm, want_mm, **TOL)
        torch.testing.assert_close(got_conv, want_conv, **TOL)


def device_samples(name):
    """test_py_torch2's opcheck samples (dtypes, strides, padding, groups,
    bias, empty and transposed operands), on the device."""
    from test_py_torch2 import samples
    return [(tuple(on(t) if isinstance(t, torch.Tensor) else t for t in args), kw)
            for args, kw in samples(name)]


@need_device
@need_torch2
class TestTorchOps(unittest.TestCase):
    """The ops as torch ops on the device."""

    def test_opcheck_with_device_samples(self):
        for name in ("nms", "mm", "conv2d", "conv2d.padding"):
            base, _, overload = name.partition(".")
            top = getattr(getattr(tops(), base), overload or "default")
            for args, kwargs in device_samples(name):
                for rg in (False, True):
                    a = tuple(t.clone().requires_grad_(rg and t.is_floating_point())
                              if isinstance(t, torch.Tensor) else t for t in args)
                    result = torch.library.opcheck(top, a, kwargs)
                    self.assertEqual(set(result.values()), {"SUCCESS"}, (name, rg, result))

    def test_gradcheck_in_float64_on_the_device(self):
        g = gen(9)
        a = on(torch.randn(3, 4, dtype=torch.float64, generator=g)).requires_grad_()
        b = on(torch.randn(4, 2, dtype=torch.float64, generator=g)).requires_grad_()
        self.assertTrue(torch.autograd.gradcheck(tops().mm, (a, b)))
        x = on(torch.randn(2, 4, 7, 6, dtype=torch.float64, generator=g)).requires_grad_()
        w = on(torch.randn(6, 2, 3, 2, dtype=torch.float64, generator=g)).requires_grad_()
        bias = on(torch.randn(6, dtype=torch.float64, generator=g)).requires_grad_()
        f = lambda x, w, bias: tops().conv2d(x, w, bias, [2, 1], [1, 2], [1, 2], 2)  # noqa: E731
        self.assertTrue(torch.autograd.gradcheck(f, (x, w, bias)))
        f = lambda x, w: tops().conv2d(x, w, None, [1, 1], "same", [1, 1], 2)  # noqa: E731
        self.assertTrue(torch.autograd.gradcheck(f, (x, w)))

    def test_compile_fullgraph_on_device_inputs(self):
        torch._dynamo.reset()
        g = gen(10)
        w1 = on(torch.randn(8, 3, 3, 3, generator=g) * 0.3)
        w2 = on(torch.randn(8 * 8 * 8, 10, generator=g) * 0.1)

        def net(x):
            y = torch.relu(tops().conv2d(x, w1, None, [2, 2], [1, 1]))
            return tops().mm(y.flatten(1), w2) * 0.5 + 1.0
        x = on(torch.randn(2, 3, 16, 16, generator=g))
        with torch.no_grad():
            want = net(x)
            got = torch.compile(net, fullgraph=True)(x)  # inductor
        self.assertEqual(got.device.type, DEVICE)
        torch.testing.assert_close(got, want)
        ref = torch.mm(torch.relu(F.conv2d(x, w1, None, 2, 1)).flatten(1), w2) * 0.5 + 1.0
        torch.testing.assert_close(want, ref, **TOL)
        # and a training step through the registered gradients
        wt = w1.clone().requires_grad_()
        step = torch.compile(lambda x: tops().conv2d(x, wt, None, [1, 1], [1, 1]).square().mean(),
                             fullgraph=True, backend="aot_eager")
        step(x).backward()
        wr = w1.clone().requires_grad_()
        F.conv2d(x, wr, None, 1, 1).square().mean().backward()
        torch.testing.assert_close(wt.grad, wr.grad, **TOL)


if __name__ == "__main__":
    unittest.main()
