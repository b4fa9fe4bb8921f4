"""register_torch: opjit ops as torch.ops.<namespace>.<name>, defined with
their schema through torch.library, called from Python and from
torch.jit.script code, on CPU (and CUDA where torch has a GPU)."""
import unittest

import opjit
from opjit_testing import F, need_torch, need_torchvision, random_boxes, runtime, torch, torchvision


@need_torch
class TestRegisterTorch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = runtime()
        cls.nms = opjit.register_torch(cls.rt.load_op("nms"))
        cls.mm = opjit.register_torch("mm", runtime=cls.rt)
        cls.conv2d = opjit.register_torch("conv2d", runtime=cls.rt)

    def boxes(self, n=300, seed=3):
        b, s = random_boxes(n, seed)
        return torch.from_numpy(b), torch.from_numpy(s)

    @need_torchvision
    def test_nms_from_python(self):
        b, s = self.boxes()
        self.assertIs(self.nms, torch.ops.opjit.nms)
        got = torch.ops.opjit.nms(b, s, 0.5)
        self.assertTrue(torch.equal(got, torchvision.ops.nms(b, s, 0.5)))
        self.assertTrue(torch.equal(torch.ops.opjit.nms(b, s, iou_threshold=0.5), got))

    @need_torchvision
    def test_nms_from_torchscript(self):
        @torch.jit.script
        def detect(boxes: torch.Tensor, scores: torch.Tensor, thr: float) -> torch.Tensor:
            keep = torch.ops.opjit.nms(boxes, scores, thr)
            return keep[:10]
        b, s = self.boxes(500, 4)
        for thr in (0.3, 0.7):
            self.assertTrue(torch.equal(detect(b, s, thr), torchvision.ops.nms(b, s, thr)[:10]))
        self.assertIn("opjit::nms", str(detect.graph))

    def test_mm_and_conv2d_with_defaults_in_torchscript(self):
        @torch.jit.script
        def block(x: torch.Tensor, w: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
            y = torch.ops.opjit.conv2d(x, w, None, [1, 1], [1, 1])
            z = torch.ops.opjit.conv2d(x, w)  # every default from the schema
            return torch.ops.opjit.mm(y.flatten(1), a) + z.sum()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, 3, 8, 8, generator=g)
        w = torch.randn(4, 3, 3, 3, generator=g)
        a = torch.randn(4 * 8 * 8, 5, generator=g)
        want = torch.mm(F.conv2d(x, w, None, 1, 1).flatten(1), a) + F.conv2d(x, w).sum()
        torch.testing.assert_close(block(x, w, a), want, rtol=1e-4, atol=1e-3)

    def test_registering_again_and_elsewhere(self):
        self.assertIs(opjit.register_torch("mm", runtime=self.rt), self.mm)
        other = opjit.register_torch(self.rt.load_op("mm"), namespace="opjit_test_ns")
        a = torch.randn(3, 3)
        torch.testing.assert_close(other(a, a), a @ a)

    def test_a_different_schema_under_a_registered_name_is_refused(self):
        import os
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "mm.c"), "w") as f:
                f.write('#include <opjit_op.h>\n'
                        'static int k(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }\n'
                        'OPJIT_MODULE(mm, m) { opjit_def(m, "mm(Tensor a) -> Tensor", OPJIT_CPU, k, ""); }\n')
            other = opjit.Runtime(ops_path=d, tiering=False).load_op("mm")
            with self.assertRaises(opjit.Error):
                opjit.register_torch(other)

    def test_another_runtimes_op_under_a_registered_name_is_refused(self):
        # #20.10: the same name and schema from another runtime (another
        # source) must not silently call the first runtime's op.
        import os
        import tempfile
        src = ('#include <opjit_op.h>\n'
               'static int k(opjit_ctx *c, opjit_args *a)\n'
               '{\n'
               '    int64_t one = 1;\n'
               '    DLTensor *o = opjit_output(c, 0, OPJIT_INT64, 1, &one);\n'
               '    (void)a;\n'
               '    if (!o) return -1;\n'
               '    *(int64_t *)o->data = %d;\n'
               '    return 0;\n'
               '}\n'
               'OPJIT_MODULE(twin, m) { opjit_def(m, "twin(Tensor x) -> Tensor", OPJIT_CPU, k, ""); }\n')
        with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
            for d, value in ((d1, 1), (d2, 2)):
                with open(os.path.join(d, "twin.c"), "w") as f:
                    f.write(src % value)
            first = opjit.Runtime(ops_path=d1, tiering=False).load_op("twin")
            second = opjit.Runtime(ops_path=d2, tiering=False).load_op("twin")
            self.assertEqual(first.schema, second.schema)
            x = torch.zeros(1)
            op = opjit.register_torch(first, namespace="opjit_twin")
            self.assertIs(opjit.register_torch(first, namespace="opjit_twin"), op)
            with self.assertRaises(opjit.Error) as e:
                opjit.register_torch(second, namespace="opjit_twin")
            self.assertIn("another opjit op", str(e.exception))
            self.assertIn(d1, str(e.exception))
            self.assertIn(d2, str(e.exception))
            self.assertEqual(int(op(x)[0]), 1)  # still the first
            other = opjit.register_torch(second, namespace="opjit_twin2")
            self.assertEqual(int(other(x)[0]), 2)

    def test_namespaces_must_be_identifiers(self):
        # #20.20: "" and "bad ns!" were accepted
        for ns in ("", "bad ns!", "1st", "a.b", "class", None, 3):
            with self.assertRaises(ValueError, msg=repr(ns)):
                opjit.register_torch(self.rt.load_op("mm"), namespace=ns)
        self.assertIsNotNone(opjit.register_torch(self.rt.load_op("mm"), namespace="_ok_ns2"))

    def test_errors_reach_the_caller(self):
        b, s = self.boxes(10)
        with self.assertRaises(RuntimeError) as e:  # as torch's own ops raise
            torch.ops.opjit.nms(b.int(), s, 0.5)
        self.assertIsInstance(e.exception, opjit.Error)
        self.assertIn("nms", str(e.exception))
        self.assertIn("boxes", str(e.exception))

    def test_fake_implementation(self):
        mm = self.rt.load_op("mm")

        def mm_shape(a, b):
            return a.new_empty((a.shape[0], b.shape[1]))
        op = opjit.register_torch(mm, namespace="opjit_fake_test", fake=mm_shape)
        a = torch.empty(3, 4, device="meta")
        b = torch.empty(4, 6, device="meta")
        out = op(a, b)
        self.assertEqual(out.device.type, "meta")
        self.assertEqual(tuple(out.shape), (3, 6))

    @unittest.skipUnless(torch is not None and torch.cuda.is_available(), "no CUDA GPU for torch")
    def test_cuda_on_torchs_current_stream(self):  # pragma: no cover - needs a GPU
        rt = opjit.Runtime(tiering=False)
        nms = rt.load_op("nms")
        if "cuda" not in nms.devices:
            self.skipTest("nms.cu did not load (NVRTC missing?)")
        op = opjit.register_torch(nms, namespace="opjit_cuda_test")
        b, s = self.boxes(2000, 8)
        want = torchvision.ops.nms(b, s, 0.5) if torchvision else nms(b, s, 0.5)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            bc, sc = b.cuda(), s.cuda()  # made on this stream; opjit must run after
            got = op(bc, sc, 0.5)
            got_direct = nms(bc, sc, 0.5)
        torch.cuda.synchronize()
        self.assertEqual(got.device.type, "cuda")
        self.assertTrue(torch.equal(got.cpu(), want))
        self.assertTrue(torch.equal(got_direct.cpu(), want))


if __name__ == "__main__":
    unittest.main()
