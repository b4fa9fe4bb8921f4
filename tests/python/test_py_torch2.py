"""opjit ops as first-class torch ops, from what their sources declare:
shape rules (Op.output_shapes, TensorMeta, the fake kernel), gradients
(the autograd formula calling the backward op) and non-differentiability.

On torch >= 2.4 (the torch 2 virtual environment): torch.library.opcheck
(schema, autograd registration, fake tensor, AOT dispatch) passes for every
shipped op and the test ops on varied samples; gradcheck in float64;
torch.compile(fullgraph=True) traces models mixing opjit ops with torch
ops (inductor) and matches eager; nms's fake kernel has a data-dependent
size. On Debian's torch 1.13 the gradients (an autograd.Function at the
Autograd key) are checked, and the rest is skipped."""
import itertools
import os
import tempfile
import unittest

import opjit
from opjit_testing import OPS_SRC, TEST_OPS, need_torch, random_boxes, runtime, torch

NS = "opjit_t2"  # the torch namespace of this file's registrations
TORCH2 = torch is not None and hasattr(torch.library, "opcheck") and \
    hasattr(torch.library, "register_autograd")
need_torch2 = unittest.skipUnless(TORCH2, "needs torch >= 2.4 (the torch 2 virtual environment)")

_rt = None


def setUpModule():
    global _rt
    _rt = runtime()
    for name in ("nms", "mm", "conv2d", "scale", "scale_nograd", "fill"):
        _rt.load_op(name)
    if torch is not None:
        for name in ("nms", "mm", "conv2d", "scale", "scale_nograd", "fill"):
            opjit.register_torch(_rt.load_op(name), namespace=NS)


def ops():
    return getattr(torch.ops, NS)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


class TestDeclarations(unittest.TestCase):
    """What Op.declarations and Op.output_shapes say, with no torch needed."""

    def test_shipped_ops_declare_shape_rules(self):
        for name in ("nms", "mm", "conv2d", "conv2d.padding"):
            op = _rt.load_op("conv2d::" + name) if "." in name else _rt.load_op(name)
            d = op.declarations
            self.assertTrue(d["shape_rule"], name)
        self.assertEqual(_rt.load_op("nms").declarations,
                         {"gradient": "not differentiable", "shape_rule": True})
        for module, fwd, bwd, n in (("mm", "mm", "mm_backward", 2),
                                    ("conv2d", "conv2d", "conv2d_backward", 3),
                                    ("conv2d", "conv2d.padding", "conv2d_backward.padding", 3)):
            d = _rt.load_op("%s::%s" % (module, fwd)).declarations
            self.assertEqual((d["gradient"], d["backward"], d["inputs"]),
                             ("derivative", bwd, tuple(range(n))))
            self.assertTrue(_rt.load_op("%s::%s" % (module, bwd)).declarations["shape_rule"])

    def test_a_derivative_as_data(self):
        d = _rt.load_op("scale").declarations
        self.assertEqual(d["gradient"], "derivative")
        self.assertEqual(d["backward"], "scale_backward")
        self.assertEqual(d["inputs"], (0, 2))  # self, shift
        self.assertEqual(d["backward_args"], (("grad", 0), ("input", 1), ("input", 2), ("mask", 0)))
        self.assertEqual(_rt.load_op("scale_nograd").declarations,
                         {"gradient": "undeclared", "shape_rule": True})

    def test_output_shapes_read_no_data(self):
        M = opjit.TensorMeta
        conv = _rt.load_op("conv2d")
        self.assertEqual(conv.output_shapes(M((2, 3, 9, 9), "float64"), M((6, 1, 3, 3), "float64"),
                                            None, [2, 2], [1, 1], [2, 2], 3),
                         (((2, 6, 4, 4), "float64", ()),))
        self.assertEqual(_rt.load_op("nms").output_shapes(M((30, 4), "float32"), M((30,), "float32"),
                                                          iou_threshold=0.5),
                         (((30,), "int64", (0,)),))
        mm = _rt.load_op("mm")
        self.assertEqual(mm.output_shapes(M((3, 4), "float32", (1, 3)), M((4, 5), "float32")),
                         (((3, 5), "float32", ()),))
        # refused as a call is refused: RuntimeErrors, as torch raises
        with self.assertRaises(RuntimeError) as e:
            mm.output_shapes(M((3, 4), "float32"), M((5, 5), "float32"))
        self.assertIsInstance(e.exception, opjit.KernelError)
        self.assertIn("cannot be multiplied", str(e.exception))
        with self.assertRaises(opjit.NotFoundError):
            _rt.load_op("probe").output_shapes(M((2,), "float32"))
        with self.assertRaises(opjit.CallError) as e:  # a call needs data
            mm(M((3, 4), "float32"), M((4, 5), "float32"))
        self.assertIn("no data", str(e.exception))
        self.assertIsInstance(e.exception, RuntimeError)
        for bad in ((("a",), "float32"), ((2,), "float99"), ((2,), "float32", (1, 1)),
                    ((2,), "float32", None, "tpu")):
            with self.assertRaises((ValueError, TypeError)):
                M(*bad)


@need_torch
class TestGradients(unittest.TestCase):
    """The autograd formula from the declared derivative; torch 1.13 too."""

    def test_gradcheck_of_the_test_op(self):
        x = torch.randn(3, 5, dtype=torch.float64, generator=gen(1), requires_grad=True)
        s = torch.randn(3, 5, dtype=torch.float64, generator=gen(2), requires_grad=True)
        self.assertTrue(torch.autograd.gradcheck(lambda a, b: ops().scale(a, 1.5, b), (x, s)))
        # an input that needs no gradient gets none, and output_mask says so
        y = ops().scale(x, -2.0)
        (gx,) = torch.autograd.grad(y.sum(), x)
        self.assertTrue(torch.equal(gx, torch.full_like(x, -2.0)))

    def test_not_twice_differentiable_says_so(self):
        x = torch.randn(4, dtype=torch.float64, generator=gen(3), requires_grad=True)
        with self.assertRaises(RuntimeError) as e:
            torch.autograd.gradgradcheck(lambda a: ops().scale(a, 3.0), (x,))
        self.assertIn("scale_backward has no derivative", str(e.exception))
        self.assertIn("not twice differentiable", str(e.exception))

    def test_no_gradient_declared_is_an_error_at_backward_never_a_detach(self):
        x = torch.randn(4, generator=gen(4), requires_grad=True)
        y = ops().scale_nograd(x, 2.0)
        self.assertTrue(y.requires_grad)  # not silently detached
        with self.assertRaises(RuntimeError) as e:
            y.sum().backward()
        self.assertIn("scale_nograd has no derivative", str(e.exception))
        self.assertIsNone(x.grad)
        with torch.no_grad():  # no gradient wanted: fine
            self.assertTrue(torch.equal(ops().scale_nograd(x, 2.0), 2 * x))

    def test_not_differentiable_outputs_need_no_grad(self):
        b, s = (torch.from_numpy(a) for a in random_boxes(50, 5))
        b.requires_grad_()
        keep = ops().nms(b, s, 0.5)
        self.assertFalse(keep.requires_grad)
        b[keep].sum().backward()  # the gradient flows around nms, through indexing
        self.assertEqual(float(b.grad.sum()), 4.0 * len(keep))

    def test_an_op_that_writes_an_input_refuses_a_gradient(self):
        x = torch.zeros(6)
        self.assertEqual(int(ops().fill(x, 2.5)[0]), 6)
        self.assertTrue(torch.equal(x, torch.full((6,), 2.5)))
        with self.assertRaises(RuntimeError) as e:
            ops().fill(torch.zeros(6, requires_grad=True), 1.0)
        self.assertIn("writes an input in place", str(e.exception))

    def test_gradcheck_of_the_shipped_ops(self):
        g = gen(6)
        a = torch.randn(3, 4, dtype=torch.float64, generator=g, requires_grad=True)
        b = torch.randn(4, 2, dtype=torch.float64, generator=g, requires_grad=True)
        self.assertTrue(torch.autograd.gradcheck(ops().mm, (a, b)))
        x = torch.randn(2, 4, 7, 6, dtype=torch.float64, generator=g, requires_grad=True)
        w = torch.randn(6, 2, 3, 2, dtype=torch.float64, generator=g, requires_grad=True)
        bias = torch.randn(6, dtype=torch.float64, generator=g, requires_grad=True)
        for stride, pad, dil in (([1, 1], [0, 0], [1, 1]), ([2, 1], [1, 2], [1, 2])):
            f = lambda x, w, bias: ops().conv2d(x, w, bias, stride, pad, dil, 2)  # noqa: E731
            self.assertTrue(torch.autograd.gradcheck(f, (x, w, bias)))
        f = lambda x, w: ops().conv2d(x, w, None, [1, 1], "same", [1, 1], 2)  # noqa: E731
        self.assertTrue(torch.autograd.gradcheck(f, (x, w)))
        # their backward ops declare no derivative: not twice differentiable, said so
        with self.assertRaises(RuntimeError) as e:
            torch.autograd.gradgradcheck(ops().mm, (a, b))
        self.assertIn("mm_backward has no derivative", str(e.exception))
        self.assertIn("not twice differentiable", str(e.exception))
        with self.assertRaises(RuntimeError) as e:
            torch.autograd.gradgradcheck(lambda x, w: ops().conv2d(x, w, None, 1, 1, 1, 2),
                                         (x, w))
        self.assertIn("conv2d_backward has no derivative", str(e.exception))


def conv_samples():
    """(args, kwargs) for conv2d, each of strides, padding, dilation,
    groups, bias or not, float32 and float64 varied across the samples (not
    every combination: opcheck takes a while each), unbatched, channels
    last."""
    g = gen(7)
    out = []
    for dtype, (n, c, o, groups), stride, pad, dil, bias in (
            (torch.float32, (2, 4, 6, 1), [1, 1], [0, 0], [1, 1], True),
            (torch.float64, (2, 4, 6, 1), [2, 1], [1, 2], [1, 1], False),
            (torch.float32, (1, 6, 6, 3), [1, 1], [1, 2], [2, 1], False),
            (torch.float64, (1, 6, 6, 3), [2, 1], [0, 0], [2, 1], True),
            (torch.float32, (2, 4, 4, 4), [2, 2], [1, 1], [1, 2], True),
            (torch.float64, (3, 2, 4, 1), [1, 2], [2, 0], [1, 1], True)):
        x = torch.randn(n, c, 8, 7, dtype=dtype, generator=g)
        w = torch.randn(o, c // groups, 3, 2, dtype=dtype, generator=g)
        b = torch.randn(o, dtype=dtype, generator=g) if bias else None
        out.append(((x, w, b, stride, pad, dil, groups), {}))
    x = torch.randn(3, 9, 9, generator=g)  # unbatched
    w = torch.randn(5, 3, 3, 3, generator=g)
    out.append(((x, w), {"padding": [1, 1]}))
    xt = torch.randn(2, 9, 9, 3, generator=g).permute(0, 3, 1, 2)  # channels last
    out.append(((xt, w, None, [1, 1], [1, 1]), {}))
    return out


def samples(name):
    g = gen(8)
    if name == "mm":
        out = []
        for dtype, (n, k, m) in itertools.product((torch.float32, torch.float64),
                                                  ((3, 4, 5), (1, 7, 1), (0, 3, 2), (4, 0, 3))):
            out.append(((torch.randn(n, k, dtype=dtype, generator=g),
                         torch.randn(k, m, dtype=dtype, generator=g)), {}))
        a = torch.randn(5, 4, generator=g)
        out.append(((a.t(), a), {}))  # a transposed operand
        return out
    if name == "nms":
        out = []
        for n, dtype, thr in ((40, "float32", 0.5), (25, "float64", 0.3), (0, "float32", 0.5),
                              (1, "float32", 0.7)):
            b, s = random_boxes(max(n, 1), n + 1, dtype)
            out.append(((torch.from_numpy(b[:n]), torch.from_numpy(s[:n]), thr), {}))
        return out
    if name == "conv2d":
        return conv_samples()
    if name == "conv2d.padding":
        x, w = torch.randn(2, 3, 9, 8, generator=g), torch.randn(4, 3, 3, 2, generator=g)
        return [((x, w), {"padding": "same"}), ((x, w, None, [1, 1], "valid", [2, 1]), {})]
    if name == "scale":
        x = torch.randn(3, 4, dtype=torch.float64, generator=g)
        return [((x, 2.0, torch.randn(3, 4, dtype=torch.float64, generator=g)), {}),
                ((x.float(),), {"alpha": -1.0})]
    if name == "scale_nograd":
        return [((torch.randn(5, generator=g), 3.0), {})]
    raise KeyError(name)


@need_torch2
class TestOpcheck(unittest.TestCase):
    """torch.library.opcheck: schema, autograd registration, fake tensor
    and AOT dispatch, on every sample, with and without gradients."""

    def check(self, name, grads):
        base, _, overload = name.partition(".")
        op = getattr(getattr(ops(), base), overload or "default")
        for args, kwargs in samples(name):
            variants = [False, True] if grads else [False]
            for rg in variants:
                a = [t.clone().requires_grad_(rg and t.is_floating_point())
                     if isinstance(t, torch.Tensor) else t for t in args]
                result = torch.library.opcheck(op, tuple(a), kwargs)
                self.assertEqual(set(result.values()), {"SUCCESS"}, (name, rg, result))

    def test_nms(self):
        self.check("nms", grads=True)  # not differentiable: no gradient, no error

    def test_mm(self):
        self.check("mm", grads=True)

    def test_conv2d(self):
        self.check("conv2d", grads=True)
        self.check("conv2d.padding", grads=True)

    def test_backward_ops(self):
        for fwd in ("mm", "conv2d"):
            bname = _rt.load_op(fwd).declarations["backward"]
            bw = getattr(getattr(ops(), bname), "default")
            for args, kwargs in samples(fwd)[:3]:
                if kwargs or not all(isinstance(t, torch.Tensor) for t in args[:2]):
                    continue
                if fwd == "conv2d":  # every argument, defaults filled
                    args = tuple(args) + (None, [1, 1], [0, 0], [1, 1], 1)[len(args) - 2:]
                out = getattr(ops(), fwd)(*args)
                grad = torch.randn_like(out)
                n = len(_rt.load_op(fwd).declarations["inputs"])
                for mask in itertools.product((0, 1), repeat=n):
                    full = (grad,) + tuple(args) + (list(mask),)
                    result = torch.library.opcheck(bw, full)
                    self.assertEqual(set(result.values()), {"SUCCESS"}, (bname, mask, result))

    def test_test_ops(self):
        self.check("scale", grads=True)
        self.check("scale_nograd", grads=False)
        x = torch.zeros(7)
        result = torch.library.opcheck(ops().fill.default, (x, 1.5))
        self.assertEqual(set(result.values()), {"SUCCESS"}, result)

    def test_fake_kernel_of_nms_has_a_data_dependent_size(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        env = ShapeEnv(allow_dynamic_output_shape_ops=True)
        with FakeTensorMode(shape_env=env):
            keep = ops().nms(torch.empty(37, 4), torch.empty(37), 0.5)
        n = keep.shape[0]
        self.assertIsInstance(n, torch.SymInt)
        self.assertEqual(keep.dtype, torch.int64)
        bound = env.var_to_range[n.node.expr]
        self.assertEqual((int(bound.lower), int(bound.upper)), (0, 37))

    def test_fake_kernel_raises_what_the_call_raises(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            with self.assertRaises(RuntimeError) as e:
                ops().mm(torch.empty(3, 4), torch.empty(5, 6))
        self.assertIn("cannot be multiplied", str(e.exception))
        with self.assertRaises(RuntimeError):
            ops().mm(torch.empty(3, 4), torch.empty(5, 6))
        with self.assertRaises(RuntimeError):  # the schema's own checks, as for a call
            ops().conv2d(torch.empty(1, 2, 5, 5), torch.empty(3, 2, 3, 3, dtype=torch.float64))


class SmallNet(torch.nn.Module if torch is not None else object):
    """opjit conv2d and mm between torch's own ops."""

    def __init__(self, conv=None, mm=None):
        super().__init__()
        g = gen(9)
        self.w1 = torch.nn.Parameter(torch.randn(8, 3, 3, 3, generator=g) * 0.3)
        self.b1 = torch.nn.Parameter(torch.randn(8, generator=g) * 0.1)
        self.w2 = torch.nn.Parameter(torch.randn(8, 4, 3, 3, generator=g) * 0.3)
        self.fc = torch.nn.Parameter(torch.randn(8 * 4 * 4, 10, generator=g) * 0.1)
        self.conv = conv or ops().conv2d
        self.mm = mm or ops().mm

    def forward(self, x):
        y = torch.relu(self.conv(x, self.w1, self.b1, [2, 2], [1, 1]))
        y = torch.sigmoid(self.conv(y, self.w2, None, [2, 2], [1, 1], [1, 1], 2))
        return self.mm(y.flatten(1), self.fc) * 0.5 + 1.0


@need_torch2
class TestCompile(unittest.TestCase):
    """torch.compile(fullgraph=True): a graph break is an error."""

    def setUp(self):
        torch._dynamo.reset()

    def test_a_model_mixing_opjit_and_torch_ops_with_inductor(self):
        net = SmallNet()
        x = torch.randn(2, 3, 16, 16, generator=gen(10))
        with torch.no_grad():
            want = net(x)
            got = torch.compile(net, fullgraph=True)(x)  # the default backend: inductor
        torch.testing.assert_close(got, want)
        ref = SmallNet(conv=torch.nn.functional.conv2d, mm=torch.mm)
        with torch.no_grad():
            torch.testing.assert_close(want, ref(x), rtol=1e-4, atol=1e-4)

    def test_training_step_compiles(self):
        x = torch.randn(2, 3, 16, 16, generator=gen(11))
        grads = []
        for compiled in (False, True):
            net = SmallNet()
            step = torch.compile(net, fullgraph=True, backend="aot_eager") if compiled else net
            step(x).square().mean().backward()
            grads.append([p.grad for p in net.parameters()])
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)

    def test_training_through_the_test_op_compiles(self):
        x = torch.randn(4, 3, dtype=torch.float64, generator=gen(12))
        w = torch.randn(3, 3, dtype=torch.float64, generator=gen(13))

        def loss(x, w):
            return ops().scale(torch.tanh(x @ w), 0.5, x).sum()
        grads = []
        for fn in (loss, torch.compile(loss, fullgraph=True, backend="aot_eager")):
            ww = w.clone().requires_grad_()
            fn(x, ww).backward()
            grads.append(ww.grad)
        torch.testing.assert_close(grads[0], grads[1])

    def test_nms_data_dependent_size_under_compile(self):
        b, s = (torch.from_numpy(a) for a in random_boxes(60, 14))

        def kept_area(b, s):
            keep = ops().nms(b, s, 0.5)
            k = b[keep]
            return ((k[:, 2] - k[:, 0]) * (k[:, 3] - k[:, 1])).sum()
        old = torch._dynamo.config.capture_dynamic_output_shape_ops
        torch._dynamo.config.capture_dynamic_output_shape_ops = True
        try:
            got = torch.compile(kept_area, fullgraph=True, backend="aot_eager")(b, s)
        finally:
            torch._dynamo.config.capture_dynamic_output_shape_ops = old
        torch.testing.assert_close(got, kept_area(b, s))


if __name__ == "__main__":
    unittest.main()
