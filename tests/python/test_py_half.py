"""float16 and bfloat16 through the Python front: nms takes half boxes and
scores and keeps exactly what torchvision keeps for the same values in
float32 (the IoU in float32, as torchvision's CUDA kernel computes it for
half; its CPU kernel takes no half)."""
import unittest

from opjit_testing import need_torch, need_torchvision, random_boxes, runtime, torch, torchvision


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


if __name__ == "__main__":
    unittest.main()
