"""Tensors cross the Python boundary without a copy: the kernel sees the
caller's memory (tests/python/ops/probe.c reports the addresses it sees,
fill.c writes into its argument), and an output is the memory the kernel
wrote, owned by the returned tensor and alive after its runtime."""
import gc
import unittest

import opjit
from opjit_testing import need_numpy, need_torch, np, runtime, torch


def np_addr(a):
    return a.__array_interface__["data"][0]


class Producer:
    """A framework opjit does not know, with no from_dlpack: outputs come
    back as opjit.DLPackTensor."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


@need_torch
@need_numpy
class TestZeroCopy(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = runtime()
        cls.probe = cls.rt.load_op("probe")
        cls.fill = cls.rt.load_op("fill")

    def test_kernel_sees_torch_memory(self):
        x = torch.randn(3, 5)
        for t in (x, x[1:], x[2], x.t()):
            seen = self.probe(t)
            self.assertEqual(seen[0].item(), t.data_ptr())

    def test_torch_output_is_the_kernels_memory(self):
        out = self.probe(torch.zeros(2))
        self.assertEqual(out[1].item(), out.data_ptr())
        self.assertEqual(out.data_ptr() % 64, 0)  # opjit's 64-byte aligned block

    def test_kernel_sees_numpy_memory(self):
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        for t in (x, x[1:], x[:, 1]):
            self.assertEqual(self.probe(t)[0], np_addr(t))

    def test_numpy_output_is_the_kernels_memory(self):
        out = self.probe(np.zeros(2, np.float32))
        self.assertIsInstance(out, np.ndarray)
        self.assertEqual(out[1], np_addr(out))

    def test_capsules_in_and_out(self):
        x = torch.randn(4)
        cap = self.probe(torch.utils.dlpack.to_dlpack(x))
        out = torch.utils.dlpack.from_dlpack(cap)
        self.assertEqual(out[0].item(), x.data_ptr())
        self.assertEqual(out[1].item(), out.data_ptr())

    def test_kernel_writes_the_callers_tensor(self):
        x = torch.zeros(10)
        n = self.fill(x[4:], 2.5)
        self.assertEqual(n.item(), 6)
        self.assertEqual(x.tolist(), [0.0] * 4 + [2.5] * 6)
        a = np.zeros(10, np.float32)
        self.fill(a[3:], -1.0)
        self.assertEqual(a.tolist(), [0.0] * 3 + [-1.0] * 7)
        shared = torch.from_numpy(a)  # one buffer, two frameworks
        self.fill(shared, 7.0)
        self.assertTrue((a == 7.0).all())

    def test_outputs_outlive_their_runtime(self):
        rt = runtime()
        probe = rt.load_op("probe")
        t = probe(torch.zeros(1))
        n = probe(np.zeros(1, np.float32))
        del probe, rt
        gc.collect()
        self.assertEqual(t[1].item(), t.data_ptr())
        self.assertEqual(n[1], np_addr(n))

    def test_other_producers_get_a_dlpack_tensor(self):
        x = np.arange(3, dtype=np.float32)
        out = self.probe(Producer(x))
        self.assertIsInstance(out, opjit.DLPackTensor)
        self.assertEqual(out.__dlpack_device__(), (1, 0))
        self.assertEqual(out.shape, (2,))
        arr = np.from_dlpack(out)
        self.assertEqual(arr[0], np_addr(x))
        self.assertEqual(arr[1], np_addr(arr))
        with self.assertRaises(BufferError):
            out.__dlpack__()  # exported once
        with self.assertRaises(TypeError):
            opjit.DLPackTensor()

    def test_dlpack_keywords(self):
        out = self.probe(Producer(np.arange(3, dtype=np.float32)))
        with self.assertRaisesRegex(TypeError, "unexpected keyword argument 'strem'"):
            out.__dlpack__(strem=None)
        with self.assertRaisesRegex(TypeError, "keyword arguments only"):
            out.__dlpack__(None)
        with self.assertRaisesRegex(BufferError, "without a copy"):
            out.__dlpack__(copy=True)
        self.assertEqual(out.shape, (2,))  # none of those exported it
        # the array API's keywords, each accepted (a str subclass too)
        class Key(str):
            pass
        cap = out.__dlpack__(**{Key("stream"): None}, max_version=(1, 0), dl_device=(1, 0),
                             copy=False)
        self.assertEqual(type(cap).__name__, "PyCapsule")
        self.assertIsNone(out.shape)


if __name__ == "__main__":
    unittest.main()
