"""A value the binding cannot pass (a nested list, an element that is not an
int, an int past int64, an object of no known kind) is refused with a
message naming the op, the argument, what its schema takes and what was
given: "conv2d: argument 'stride': expected int[2] (an int or a list of 2
ints), got a list of list (element 0 is [1])"."""
import unittest

import opjit
from opjit_testing import need_torch, runtime, torch


@need_torch
class TestArgumentMessages(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        rt = runtime()
        cls.conv = rt.load_op("conv2d")
        cls.scalars = rt.load_op("scalars")
        cls.x, cls.w = torch.rand(1, 1, 5, 5), torch.rand(1, 1, 3, 3)

    def message(self, fn, *args, **kw):
        with self.assertRaises(opjit.CallError) as e:
            fn(*args, **kw)
        return str(e.exception)

    def conv_message(self, **kw):
        return self.message(self.conv, self.x, self.w, **kw)

    def test_nested_lists(self):
        m = self.conv_message(stride=[[1], [2]])
        self.assertEqual(m, "conv2d: argument 'stride': expected int[2] (an int or a list of 2 "
                            "ints), got a list of list (element 0 is [1])")
        m = self.message(self.scalars, 1, 2.0, True, (1, (2,)))
        self.assertIn("argument 'l': expected int[2] (an int or a list of 2 ints), got a tuple "
                      "of tuple (element 1 is (2,))", m)

    def test_elements_that_are_not_ints(self):
        m = self.conv_message(padding=[1, "a"])
        self.assertIn("argument 'padding': expected int[2] (an int or a list of 2 ints), got a "
                      "list of str (element 1 is 'a')", m)
        m = self.conv_message(dilation=[1.5, 1])
        self.assertIn("argument 'dilation'", m)
        self.assertIn("got a list of float (element 0 is 1.5)", m)
        m = self.conv_message(stride=[2 ** 70, 1])
        self.assertIn("got a list of int (element 0 is %d, out of int64 range)" % 2 ** 70, m)

    def test_lists_too_long(self):
        m = self.conv_message(stride=[1] * 40)
        self.assertIn("argument 'stride': expected int[2] (an int or a list of 2 ints), got a "
                      "list of 40 (too long", m)

    def test_wrong_kinds(self):
        m = self.conv_message(stride=object())
        self.assertEqual(m, "conv2d: argument 'stride': expected int[2] (an int or a list of 2 "
                            "ints), got object")
        m = self.conv_message(bias=object())
        self.assertIn("argument 'bias': expected Tensor? (an object with __dlpack__ or a DLPack "
                      "capsule, or None), got object", m)
        m = self.message(self.scalars, 1, object(), True, [1, 2])
        self.assertIn("argument 'f': expected float, got object", m)
        m = self.conv_message(groups=2 ** 70)
        self.assertIn("argument 'groups': expected int, got an int out of int64 range", m)
        # Kinds the binding passes on are checked by the runtime, which
        # says the same.
        self.assertIn("argument 'stride': expected int[2], got str", self.conv_message(stride="a"))
        self.assertIn("argument 'i': expected int, got str",
                      self.message(self.scalars, "a", 2.0, True, [1, 2]))

    def test_the_cause_is_kept(self):
        with self.assertRaises(opjit.CallError) as e:
            self.conv(self.x, self.w, stride=[[1], [2]])
        self.assertIsInstance(e.exception.__cause__, TypeError)

    def test_right_values_still_pass(self):
        y = self.conv(self.x, self.w, stride=(1, 1), padding=[1, 1])
        self.assertTrue(torch.allclose(y, torch.nn.functional.conv2d(self.x, self.w, padding=1),
                                       atol=1e-5))


if __name__ == "__main__":
    unittest.main()
