"""Loading by op name from Python: load_op("gelu") gives the op gelu or
raises, never another op of the file named gelu.c (#20.9); an earlier
directory of the search path wins, as with PATH (#20.17)."""
import os
import tempfile
import unittest

import opjit

MODULE = """#include <opjit_op.h>
static int k(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }
OPJIT_MODULE(m, m) { opjit_def(m, "%s() -> Tensor", OPJIT_CPU, k, ""); }
"""


class TestNames(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def write(self, sub, name, op):
        d = os.path.join(self.tmp.name, sub)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "w") as f:
            f.write(MODULE % op)
        return d

    def test_file_named_after_another_op(self):
        d = self.write("a", "gelu.c", "relu")
        rt = opjit.Runtime(ops_path=[d], tiering=False)
        with self.assertRaises(opjit.NotFoundError) as cm:
            rt.load_op("gelu")
        self.assertIn("registers no op 'gelu'", str(cm.exception))
        self.assertIn("gelu.c registers relu", str(cm.exception))
        self.assertEqual(rt.load_op("gelu::relu").name, "relu")

    def test_earlier_directory_wins(self):
        a = self.write("a", "my_override.c", "dupop")
        b = self.write("b", "dupop.c", "dupop")
        rt = opjit.Runtime(ops_path=[a, b], tiering=False)
        op = rt.load_op("dupop")
        self.assertTrue(op.sources["cpu"].endswith("/a/my_override.c"), op.sources)
        self.assertEqual(rt.load_op("my_override::dupop").sources, op.sources)


if __name__ == "__main__":
    unittest.main()
