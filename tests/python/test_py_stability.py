"""100,000 calls leave reference counts and memory where they were: the
inputs' reference counts are unchanged, the process's resident memory and
the number of objects the garbage collector tracks do not grow. Covers the
torch, numpy and capsule paths, keywords, several outputs, and calls that
fail at each stage (binding, the runtime's checks, the kernel). Under ASan
(OPJIT_PY_SANITIZED=1) the RSS check is skipped: its quarantine holds freed
memory on purpose."""
import gc
import os
import sys
import unittest

import opjit
from opjit_testing import need_numpy, need_torch, np, random_boxes, rss_bytes, runtime, torch

CALLS = int(os.environ.get("OPJIT_PY_STABILITY_CALLS", "100000"))
RSS_SLACK = 4 << 20  # 40 bytes leaked per call would be 4 MB
SANITIZED = os.environ.get("OPJIT_PY_SANITIZED") == "1"  # set by tests/CMakeLists.txt


@need_torch
@need_numpy
class TestStability(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = runtime()
        cls.nms = cls.rt.load_op("nms")
        cls.mm = cls.rt.load_op("mm")
        cls.minmax = cls.rt.load_op("minmax")
        cls.fail_op = cls.rt.load_op("fail")
        b, s = random_boxes(8, 42)
        cls.bn, cls.sn = b, s
        cls.bt, cls.st = torch.from_numpy(b.copy()), torch.from_numpy(s.copy())

    def steady(self, call, inputs):
        """call() CALLS times; inputs' refcounts, RSS and gc objects stay."""
        for _ in range(2000):  # warm up: allocator pools, lazy lookups
            call()
        gc.collect()
        refs = [sys.getrefcount(x) for x in inputs]
        rss0 = rss_bytes()
        objs0 = len(gc.get_objects())
        for _ in range(CALLS):
            call()
        gc.collect()
        grown = rss_bytes() - rss0
        self.assertEqual([sys.getrefcount(x) for x in inputs], refs, "input refcounts")
        if not SANITIZED:  # ASan's quarantine keeps freed memory resident
            self.assertLess(grown, RSS_SLACK, "RSS grew by %d bytes over %d calls" % (grown, CALLS))
        self.assertLess(len(gc.get_objects()) - objs0, 100, "gc-tracked objects")

    def test_torch(self):
        nms, b, s = self.nms, self.bt, self.st
        self.steady(lambda: nms(b, s, 0.5), [b, s, nms])

    def test_numpy(self):
        nms, b, s = self.nms, self.bn, self.sn
        self.steady(lambda: nms(b, s, 0.5), [b, s, nms])

    def test_keywords_and_mm(self):
        mm, a = self.mm, torch.rand(4, 4)
        self.steady(lambda: mm(self=a, mat2=a), [a, mm])

    def test_two_outputs(self):
        minmax, x = self.minmax, np.arange(5, dtype=np.float32)
        self.steady(lambda: minmax(x), [x, minmax])

    def test_capsules(self):
        nms, b, s = self.nms, self.bt, self.st

        def call():
            out = nms(torch.utils.dlpack.to_dlpack(b), torch.utils.dlpack.to_dlpack(s), 0.5)
            del out  # an unconsumed output capsule frees the output
        self.steady(call, [b, s, nms])

    def test_failing_calls(self):
        nms, fail, b, s = self.nms, self.fail_op, self.bt, self.st
        bad_dtype = b.double()
        cases = [lambda: nms(b, s, "x"),          # binding
                 lambda: nms(bad_dtype, s, 0.5),  # the runtime's schema checks
                 lambda: nms(b, s, 0.5, nope=1),  # keywords
                 lambda: fail(b, 1)]              # the kernel

        def call():
            for c in cases:
                try:
                    c()
                except opjit.Error:
                    pass
        self.steady(call, [b, s, bad_dtype, nms, fail])


if __name__ == "__main__":
    unittest.main()
