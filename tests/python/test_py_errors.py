"""Every mistake a Python caller can make raises an exception naming the op
and the argument, never crashes: opjit.Error and its subclasses carry the
runtime's message (a compile error its diagnostics with file:line)."""
import ctypes
import os
import tempfile
import unittest

import opjit
from opjit_testing import OPS_SRC, need_numpy, need_torch, np, random_boxes, runtime, torch


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


def capsule(managed, name):
    """A capsule around a ctypes DLManagedTensor (which must outlive it)."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(managed), name, None)


def fake_cuda_tensor(*shape):
    """float32 of that shape claiming to live on CUDA device 0 (host memory
    behind it). Returns the DLManagedTensor and what keeps it alive."""
    n = 1
    for d in shape:
        n *= d
    buf = (ctypes.c_float * n)()
    dims = (ctypes.c_int64 * len(shape))(*shape)
    mt = DLManagedTensor()
    mt.dl_tensor = DLTensor(ctypes.cast(buf, ctypes.c_void_p), DLDevice(2, 0), len(shape),
                            DLDataType(2, 32, 1), dims, None, 0)
    return mt, (buf, dims)


@need_torch
@need_numpy
class TestCallErrors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = runtime()
        cls.nms = cls.rt.load_op("nms")
        cls.conv = cls.rt.load_op("conv2d")
        b, s = random_boxes(20, 1)
        cls.b, cls.s = torch.from_numpy(b), torch.from_numpy(s)

    def raises(self, cls, *words):
        ctx = self.assertRaises(cls)

        class Check:
            def __enter__(_):
                return ctx.__enter__()

            def __exit__(_, *exc):
                r = ctx.__exit__(*exc)
                for w in words:
                    self.assertIn(w, str(ctx.exception))
                self.assertIsInstance(ctx.exception, opjit.Error)
                return r
        return Check()

    def test_wrong_values(self):
        b, s = self.b, self.s
        with self.raises(opjit.CallError, "nms", "iou_threshold", "str"):
            self.nms(b, s, "0.5")
        with self.raises(TypeError, "nms", "boxes", "float32", "int32"):
            self.nms(b.int(), s, 0.5)
        with self.raises(opjit.CallError, "nms", "scores", "1-d", "2-d"):
            self.nms(b, s[None], 0.5)
        with self.raises(opjit.CallError, "nms", "iou_threshold", "float", "Tensor"):
            self.nms(b, s, s)
        with self.raises(opjit.CallError, "nms", "boxes", "contiguous"):
            self.nms(b.t().contiguous().t(), s, 0.5)
        with self.raises(opjit.CallError, "nms", "boxes", "object"):
            self.nms(object(), s, 0.5)

    def test_wrong_arity_and_names(self):
        b, s = self.b, self.s
        with self.raises(opjit.CallError, "nms", "iou_threshold", "missing"):
            self.nms(b, s)
        with self.raises(opjit.CallError, "nms", "boxes", "missing"):
            self.nms(None, s, 0.5)
        with self.raises(opjit.CallError, "nms", "at most 3", "4"):
            self.nms(b, s, 0.5, 1)
        with self.raises(opjit.CallError, "nms", "iou", "unexpected"):
            self.nms(b, s, iou=0.5)
        with self.raises(opjit.CallError, "nms", "boxes", "multiple values"):
            self.nms(b, s, 0.5, boxes=b)
        with self.raises(opjit.CallError, "nms", "at most"):
            self.nms(*([b] * 40))

    def test_int_and_list_values(self):
        x, w = torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 3, 3)
        with self.raises(opjit.CallError, "conv2d", "groups"):
            self.conv(x, w, groups=2 ** 70)
        with self.raises(opjit.CallError, "conv2d", "stride", "int[2]", "3"):
            self.conv(x, w, stride=[1, 1, 1])
        with self.raises(opjit.CallError, "conv2d", "stride", "too long"):
            self.conv(x, w, stride=[1] * 40)
        with self.raises(opjit.CallError, "conv2d", "padding", "element 1"):
            self.conv(x, w, padding=[1, "a"])
        with self.raises(opjit.CallError, "conv2d", "bias"):
            self.conv(x, w, bias=1.5)

    def test_bad_tensors(self):
        b, s = self.b, self.s
        cap = torch.utils.dlpack.to_dlpack(b)
        torch.utils.dlpack.from_dlpack(cap)  # consumed
        with self.raises(opjit.CallError, "nms", "boxes", "already consumed"):
            self.nms(cap, s, 0.5)
        mt, keep = fake_cuda_tensor(4)
        with self.raises(opjit.CallError, "nms", "boxes", "dltensor"):
            self.nms(capsule(mt, b"not_a_tensor"), s, 0.5)
        ro = np.zeros((3, 4), np.float32)
        ro.flags.writeable = False  # numpy 1.24 exports writeable arrays only
        try:
            ro.__dlpack__()
        except BufferError:
            with self.raises(opjit.CallError, "nms", "boxes") as e:
                self.nms(ro, np.zeros(3, np.float32), 0.5)
            self.assertIsInstance(e.exception.__cause__, BufferError)

        class Liar:
            def __dlpack__(self):
                return 42
        with self.raises(opjit.CallError, "nms", "scores"):
            self.nms(b, Liar(), 0.5)

    def test_cuda_tensor_without_a_gpu(self):
        if torch.cuda.is_available():
            self.skipTest("a GPU is present (test_py_torch_library covers CUDA)")
        boxes, keep_b = fake_cuda_tensor(8, 4)
        scores, keep_s = fake_cuda_tensor(8)
        # Loaded by name without a GPU: the CPU source only.
        with self.raises(opjit.DeviceError, "nms", "CUDA"):
            self.nms(capsule(boxes, b"dltensor"), capsule(scores, b"dltensor"), 0.5)
        with self.raises(opjit.CallError, "nms", "scores", "device"):
            self.nms(self.b, capsule(scores, b"dltensor"), 0.5)
        # With the CUDA kernel loaded (NVRTC needed), the call path says
        # what is missing: the driver, or a GPU.
        try:
            rt = runtime()
            rt.load_op(os.path.join(OPS_SRC, "nms.cu"))
        except opjit.Error as e:
            self.skipTest("nms.cu does not load here: %s" % str(e).splitlines()[0])
        nms_cu = rt.load_op("nms")
        self.assertIn("cuda", nms_cu.devices)
        for _ in range(3):  # the stream is handed over once, then kept
            with self.raises(opjit.DeviceError, "nms", "CUDA"):
                nms_cu(capsule(boxes, b"dltensor"), capsule(scores, b"dltensor"), 0.5)

    def test_status_attribute(self):
        try:
            self.nms(self.b, self.s, "x")
        except opjit.Error as e:
            self.assertEqual(e.status, "OPJIT_ECALL")


class TestLoadErrors(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.rt = runtime()

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, text):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_not_found(self):
        with self.assertRaises(opjit.NotFoundError) as e:
            self.rt.load_op("no_such_op")
        self.assertIsInstance(e.exception, LookupError)
        self.assertIn("no_such_op", str(e.exception))
        self.assertEqual(e.exception.status, "OPJIT_ENOTFOUND")

    def test_compile_error_has_file_and_line(self):
        path = self.write("broken.c", "#include <opjit_op.h>\n\nint broken(void) { return nope; }\n")
        with self.assertRaises(opjit.CompileError) as e:
            self.rt.load_op(path)
        self.assertIn("broken.c:3", str(e.exception))
        self.assertIn("nope", str(e.exception))

    def test_module_without_init(self):
        path = self.write("noinit.c", "int noinit(void) { return 1; }\n")
        with self.assertRaises(opjit.Error) as e:
            self.rt.load_op(path)
        self.assertIn("noinit", str(e.exception))

    def test_kernel_failure(self):
        fail = self.rt.load_op("fail")
        x = np.zeros(5, np.float32) if np is not None else None
        if x is None:
            self.skipTest("numpy is not installed")
        self.assertEqual(fail(x, 0)[0], 5)
        with self.assertRaises(opjit.KernelError) as e:
            fail(x, 3)
        self.assertIn("fail: asked to fail with code 3", str(e.exception))

    def test_bad_arguments_to_the_api(self):
        with self.assertRaises(TypeError):
            self.rt.load_op(None)
        with self.assertRaises(TypeError):
            opjit.Runtime(ops_path=123)
        with self.assertRaises(TypeError):
            opjit.Runtime(tiering=False, nonsense=1)
        with self.assertRaises(RuntimeError):
            opjit.Runtime.__new__(opjit.Runtime).load_op("nms")
        with self.assertRaises(TypeError):
            opjit.Op()


if __name__ == "__main__":
    unittest.main()
