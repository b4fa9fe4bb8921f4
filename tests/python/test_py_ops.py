"""Every shipped op (ops-src: nms, mm, conv2d) called from Python on torch
and numpy tensors, against torch / torchvision: nms exactly, mm and conv2d
within float tolerance. Also the Op object and how values are passed."""
import os
import unittest

import opjit
from opjit_testing import (F, OPS_SRC, need_numpy, need_torch, need_torchvision, np,
                           random_boxes, runtime, torch, torchvision)


@need_torch
@need_torchvision
@need_numpy
class TestNms(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = runtime()
        cls.nms = cls.rt.load_op("nms")

    def cases(self):
        seed = 0
        for n in (0, 1, 8, 100, 1000, 3000):
            for dtype in ("float32", "float64"):
                for iou in (0.0, 0.3, 0.5, 0.9):
                    seed += 1
                    yield n, dtype, iou, random_boxes(n, seed, dtype, ties=seed % 3 == 0)

    def test_torch_matches_torchvision_exactly(self):
        for n, dtype, iou, (b, s) in self.cases():
            with self.subTest(n=n, dtype=dtype, iou=iou):
                bt, st = torch.from_numpy(b), torch.from_numpy(s)
                got = self.nms(bt, st, iou)
                self.assertIsInstance(got, torch.Tensor)
                self.assertEqual(got.dtype, torch.int64)
                self.assertTrue(torch.equal(got, torchvision.ops.nms(bt, st, iou)))

    def test_numpy_matches_torchvision_exactly(self):
        for n, dtype, iou, (b, s) in self.cases():
            with self.subTest(n=n, dtype=dtype, iou=iou):
                got = self.nms(b, s, iou)
                self.assertIsInstance(got, np.ndarray)
                self.assertEqual(got.dtype, np.int64)
                want = torchvision.ops.nms(torch.from_numpy(b), torch.from_numpy(s), iou).numpy()
                np.testing.assert_array_equal(got, want)

    def test_keywords_and_positions(self):
        b, s = random_boxes(200, 7)
        want = self.nms(b, s, 0.5)
        for got in (self.nms(boxes=b, scores=s, iou_threshold=0.5),
                    self.nms(b, scores=s, iou_threshold=0.5),
                    self.nms(b, s, iou_threshold=0.5),
                    self.nms(iou_threshold=0.5, scores=s, boxes=b)):
            np.testing.assert_array_equal(got, want)

    def test_module_level_load_op(self):
        nms = opjit.load_op("nms")  # the default runtime: OPJIT_OPS_PATH
        b, s = random_boxes(100, 3)
        np.testing.assert_array_equal(nms(b, s, 0.5), self.nms(b, s, 0.5))
        self.assertIn(nms, opjit.list_ops())
        self.assertIs(opjit.default_runtime(), nms.runtime)


@need_torch
@need_numpy
class TestMm(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mm = runtime().load_op("mm")

    def test_torch_and_numpy_against_torch_mm(self):
        rng = np.random.default_rng(1)
        for (n, k, m) in ((1, 1, 1), (4, 4, 4), (3, 5, 7), (64, 128, 32), (0, 3, 2), (2, 0, 3)):
            for dtype, tol in (("float32", 1e-5), ("float64", 1e-12)):
                with self.subTest(shape=(n, k, m), dtype=dtype):
                    a = rng.standard_normal((n, k)).astype(dtype)
                    b = rng.standard_normal((k, m)).astype(dtype)
                    want = torch.mm(torch.from_numpy(a), torch.from_numpy(b))
                    got_t = self.mm(torch.from_numpy(a), torch.from_numpy(b))
                    got_n = self.mm(a, b)
                    self.assertIsInstance(got_t, torch.Tensor)
                    self.assertIsInstance(got_n, np.ndarray)
                    self.assertEqual(tuple(got_t.shape), (n, m))
                    torch.testing.assert_close(got_t, want, rtol=tol, atol=tol)
                    np.testing.assert_allclose(got_n, want.numpy(), rtol=tol, atol=tol)

    def test_transposed_views_without_copy(self):
        a = torch.randn(6, 9)
        b = torch.randn(6, 5)
        torch.testing.assert_close(self.mm(a.t(), b), torch.mm(a.t(), b), rtol=1e-5, atol=1e-5)
        an = a.numpy()
        np.testing.assert_allclose(self.mm(an.T, b.numpy()), torch.mm(a.t(), b).numpy(),
                                   rtol=1e-5, atol=1e-5)


@need_torch
@need_numpy
class TestConv2d(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.conv = runtime().load_op("conv2d")

    def check(self, x, w, b=None, stride=1, padding=0, dilation=1, groups=1, tol=1e-4, **kw):
        want = F.conv2d(x, w, b, stride, padding, dilation, groups)
        got = self.conv(x, w, b, stride, padding, dilation, groups, **kw)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        got_n = self.conv(x.numpy(), w.numpy(), None if b is None else b.numpy(), stride,
                          padding, dilation, groups)
        np.testing.assert_allclose(got_n, want.numpy(), rtol=tol, atol=tol)

    def test_against_torch_conv2d(self):
        g = torch.Generator().manual_seed(5)
        for (cin, cout, k, hw, stride, pad, dil, groups, bias) in (
                (3, 8, 3, 16, 1, 1, 1, 1, True), (8, 16, 1, 9, 1, 0, 1, 1, False),
                (4, 6, 3, 11, 2, 1, 1, 2, True), (4, 4, 3, 12, 1, 2, 2, 1, False),
                (2, 2, 5, 7, (2, 1), (2, 1), 1, 1, True)):
            for dtype, tol in ((torch.float32, 1e-4), (torch.float64, 1e-10)):
                with self.subTest(cin=cin, cout=cout, k=k, stride=stride, dtype=dtype):
                    x = torch.randn(2, cin, hw, hw, generator=g, dtype=dtype)
                    w = torch.randn(cout, cin // groups, k, k, generator=g, dtype=dtype)
                    b = torch.randn(cout, generator=g, dtype=dtype) if bias else None
                    self.check(x, w, b, stride, pad, dil, groups, tol=tol)

    def test_defaults_keywords_and_int_lists(self):
        x = torch.randn(1, 3, 10, 10)
        w = torch.randn(5, 3, 3, 3)
        torch.testing.assert_close(self.conv(x, w), F.conv2d(x, w), rtol=1e-4, atol=1e-4)
        want = F.conv2d(x, w, None, (2, 1), (1, 0))
        for got in (self.conv(x, w, stride=[2, 1], padding=(1, 0)),
                    self.conv(input=x, weight=w, bias=None, stride=(2, 1), padding=[1, 0])):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(self.conv(x, w, padding=1), F.conv2d(x, w, padding=1),
                                   rtol=1e-4, atol=1e-4)


@need_torch
@need_numpy
class TestOpObjectAndValues(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = runtime()

    def test_attributes(self):
        nms = self.rt.load_op("nms")
        self.assertEqual(nms.name, "nms")
        self.assertEqual(nms.schema,
                         "nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor")
        self.assertIn("cpu", nms.devices)
        self.assertEqual(nms.tier, "tcc")
        self.assertEqual(nms.tiers["cpu"], "tcc")
        self.assertEqual(os.path.realpath(nms.sources["cpu"]),
                         os.path.realpath(os.path.join(OPS_SRC, "nms.c")))
        self.assertIn("Non-maximum suppression", nms.doc)
        self.assertIn("nms(Tensor boxes", repr(nms))
        self.assertEqual(nms, self.rt.load_op("nms"))
        self.assertEqual(hash(nms), hash(self.rt.load_op("nms")))
        self.assertIs(nms.runtime, self.rt)
        self.assertIn("nms", [op.name for op in self.rt.list_ops()])
        with self.assertRaises(TypeError):
            opjit.Op()

    def test_load_by_path_and_runtime_options(self):
        rt = opjit.Runtime(ops_path=OPS_SRC, cache_dir=os.environ.get("OPJIT_CACHE_DIR"),
                           tiering=False, offline=False)
        self.assertEqual(rt.list_ops(), [])
        mm = rt.load_op(os.path.join(OPS_SRC, "mm.c"))
        self.assertEqual(mm.name, "mm")
        self.assertEqual([op.name for op in rt.list_ops()], ["mm", "mm_backward"])
        rt.unload("mm")
        self.assertEqual(rt.list_ops(), [])

    def test_tiering_swaps_in_optimized_code(self):
        import shutil
        if not shutil.which(os.environ.get("OPJIT_CC", "cc")):
            self.skipTest("no C compiler for the optimizing tier")
        rt = runtime(tiering=True)
        nms = rt.load_op("nms")
        rt.wait()
        self.assertEqual(nms.tier, "opt")
        b, s = random_boxes(500, 11)
        want = torchvision_nms(b, s, 0.5)
        if want is not None:
            np.testing.assert_array_equal(nms(b, s, 0.5), want)

    def test_output_follows_the_first_tensor(self):
        mm = self.rt.load_op("mm")
        a = np.eye(3, dtype=np.float32)
        self.assertIsInstance(mm(torch.from_numpy(a), a), torch.Tensor)
        self.assertIsInstance(mm(a, torch.from_numpy(a)), np.ndarray)
        cap = mm(torch.to_dlpack(torch.from_numpy(a)), a)  # raw capsule in: capsule out
        self.assertEqual(type(cap).__name__, "PyCapsule")
        np.testing.assert_array_equal(torch.utils.dlpack.from_dlpack(cap).numpy(), a)

    def test_two_outputs_are_a_tuple(self):
        lo, hi = self.rt.load_op("minmax")(torch.tensor([3.0, -2.0, 7.5]))
        self.assertEqual((lo.item(), hi.item()), (-2.0, 7.5))

    def test_python_values(self):
        sc = self.rt.load_op("scalars")
        t = torch.zeros(1)
        cases = [
            ((3, 0.25, True, [4, 5]), [3, 0.25, 1, 4, 5, 0, 7]),
            ((-1, 2, False, (6, 7), t), [-1, 2, 0, 6, 7, 1, 7]),
            ((np.int64(9), np.float32(1.5), np.bool_(True), 8), [9, 1.5, 1, 8, 8, 0, 7]),
            ((1, 1.0, False, [0, 0], None, 11), [1, 1, 0, 0, 0, 0, 11]),
        ]
        for args, want in cases:
            with self.subTest(args=args):
                got = sc(*args)
                # the framework of the first tensor; none given: numpy
                self.assertIsInstance(got, torch.Tensor if any(a is t for a in args) else np.ndarray)
                np.testing.assert_array_equal(np.asarray(got), np.array(want, dtype=np.float64))
        np.testing.assert_array_equal(sc(i=2, f=0.5, b=True, l=[1, 2], k=3),
                                      np.array([2, 0.5, 1, 1, 2, 0, 3], dtype=np.float64))


def torchvision_nms(b, s, iou):
    if torchvision is None:
        return None
    return torchvision.ops.nms(torch.from_numpy(b), torch.from_numpy(s), iou).numpy()


if __name__ == "__main__":
    unittest.main()
