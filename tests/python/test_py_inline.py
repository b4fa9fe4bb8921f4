"""opjit.load_inline: a module of ops from a string, its ops as attributes,
cached by content (a hit in a later interpreter), compile errors at lines of
the string, local headers only from include_dir, register_torch on its ops;
and the README's load_inline block, run as written."""
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest

import opjit
from opjit_testing import ROOT, need_numpy, need_torch, np, runtime, torch

SCALE = r"""
#include <opjit_op.h>

static int scale_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    double k = opjit_arg_float(a, 1);
    DLTensor *y = opjit_output(ctx, 0, x->dtype, x->ndim, x->shape);
    if (!y)
        return -1;
    const float *xs = opjit_data(x);
    float *ys = y->data;
    for (int64_t i = 0; i < opjit_numel(x); i++)
        ys[i] = xs[i] * (float)k + (float)(OFFSET);
    return 0;
}

static int count_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    int64_t shape[1] = {1};
    DLTensor *y = opjit_output(ctx, 0, OPJIT_INT64, 1, shape);
    if (!y)
        return -1;
    ((int64_t *)y->data)[0] = opjit_numel(x);
    return 0;
}

OPJIT_MODULE(NAME, m)
{
    opjit_def(m, "NAME(Tensor x, float k=2.0) -> Tensor", OPJIT_CPU, scale_cpu, "x * k + OFFSET");
    opjit_require(m, "x", "float32 contiguous");
    opjit_def(m, "NAME_count(Tensor x) -> Tensor", OPJIT_CPU, count_cpu, "the number of elements");
}
"""


def scale_source(name, offset="0", head=""):
    return head + "\n" + SCALE.replace("NAME", name).replace("OFFSET", offset) + \
        "/* %s %d */\n" % (name, os.getpid())


def readme_block(needle):
    """The README's python block that holds needle."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    for block in re.findall(r"^```python\n(.*?)^```", text, re.S | re.M):
        if needle in block:
            return block
    raise AssertionError("README.md has no python block with %r" % needle)


class LoadInline(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = runtime()

    @classmethod
    def tearDownClass(cls):
        cls.rt.close()

    @need_numpy
    def test_ops_are_attributes_one_call_for_the_module(self):
        m = opjit.load_inline("inl_a", scale_source("inl_a"), runtime=self.rt)
        self.assertIsInstance(m, opjit.InlineModule)
        self.assertEqual([op.name for op in m], ["inl_a", "inl_a_count"])
        self.assertEqual(len(m), 2)
        self.assertIs(m["inl_a_count"], m.inl_a_count)
        self.assertIn("inl_a_count", dir(m))
        np.testing.assert_array_equal(m.inl_a(np.ones(3, np.float32)), [2, 2, 2])
        np.testing.assert_array_equal(m.inl_a(np.ones(2, np.float32), k=3), [3, 3])
        self.assertEqual(int(m.inl_a_count(np.zeros((2, 5), np.float32))[0]), 10)
        self.assertEqual(m.inl_a.sources, {"cpu": "inl_a.c"})
        with self.assertRaises(AttributeError):
            m.inl_a = None
        with self.assertRaises(KeyError):
            m["nope"]

    @need_numpy
    def test_loading_the_name_again_replaces_the_module(self):
        m = opjit.load_inline("inl_b", scale_source("inl_b", "1"), runtime=self.rt)
        np.testing.assert_array_equal(m.inl_b(np.ones(1, np.float32)), [3])
        m2 = opjit.load_inline("inl_b", scale_source("inl_b", "10"), runtime=self.rt)
        np.testing.assert_array_equal(m2.inl_b(np.ones(1, np.float32)), [12])
        # The old handle is the same op, now on the new code.
        np.testing.assert_array_equal(m.inl_b(np.ones(1, np.float32)), [12])

    def test_compile_errors_point_at_lines_of_the_string(self):
        src = "#include <opjit_op.h>\nstatic int f(void)\n{\n    return nope;\n}\n"
        with self.assertRaises(opjit.CompileError) as cm:
            opjit.load_inline("broken", src, runtime=self.rt)
        self.assertIn("broken.c:4: error", str(cm.exception))
        self.assertEqual(cm.exception.status, "OPJIT_ECOMPILE")

    @need_numpy
    def test_local_headers_come_from_include_dir_only(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "offset.h"), "w") as f:
                f.write("#define MY_OFFSET 5\n")
            src = scale_source("inl_c", "MY_OFFSET", '#include "offset.h"')
            m = opjit.load_inline("inl_c", src, include_dir=d, runtime=self.rt)
            np.testing.assert_array_equal(m.inl_c(np.zeros(1, np.float32)), [5])
            with self.assertRaises(opjit.Error) as cm:
                opjit.load_inline("inl_c2", src.replace("inl_c", "inl_c2"), runtime=self.rt)
            self.assertIn("inl_c2.c:1: #include \"offset.h\": no include directory was given",
                          str(cm.exception))
            with self.assertRaises(opjit.Error) as cm:
                opjit.load_inline("inl_c3", scale_source("inl_c3", "0", '#include "../x.h"'),
                                  include_dir=os.path.join(d), runtime=self.rt)
            with self.assertRaises(opjit.NotFoundError):
                opjit.load_inline("inl_c4", src, include_dir=os.path.join(d, "missing"),
                                  runtime=self.rt)

    def test_bad_names_and_sources(self):
        src = scale_source("inl_d")
        with self.assertRaisesRegex(opjit.Error, "a name, not a path"):
            opjit.load_inline("a/inl_d", src, runtime=self.rt)
        with self.assertRaisesRegex(ValueError, "disagree"):
            opjit.load_inline("inl_d.cu", src, cuda=False, runtime=self.rt)
        with self.assertRaisesRegex(ValueError, "NUL"):
            opjit.load_inline("inl_d", src + "\0", runtime=self.rt)
        with self.assertRaisesRegex(opjit.Error, "empty source"):
            opjit.load_inline("inl_d", "", runtime=self.rt)
        with self.assertRaises(TypeError):
            opjit.load_inline("inl_d", src.encode(), runtime=self.rt)
        with self.assertRaises(TypeError):
            opjit.load_inline(b"inl_d", src, runtime=self.rt)

    def test_a_cache_hit_in_a_later_interpreter(self):
        """The same name and text: compiled by the first interpreter, a
        cache hit in the next (the INFO log line of each load says)."""
        src = scale_source("inl_e", "7")
        code = textwrap.dedent("""
            import logging, sys, opjit
            logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
            opjit.load_inline("inl_e", sys.stdin.read(), runtime=opjit.Runtime(tiering=False))
        """)
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, OPJIT_CACHE_DIR=cache)
            runs = [subprocess.run([sys.executable, "-c", code], input=src, env=env,
                                   capture_output=True, text=True, timeout=120)
                    for _ in range(2)]
        for r in runs:
            self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("loaded inl_e.c (tcc, compiled", runs[0].stdout)
        self.assertIn("loaded inl_e.c (tcc, cache hit", runs[1].stdout)

    @need_torch
    def test_register_torch_works_on_its_ops(self):
        m = opjit.load_inline("inl_f", scale_source("inl_f", "1"), runtime=self.rt)
        top = opjit.register_torch(m.inl_f, namespace="opjit_inline_test")
        x = torch.ones(4)
        self.assertTrue(torch.equal(top(x, 3.0), torch.full((4,), 4.0)))
        self.assertTrue(torch.equal(torch.ops.opjit_inline_test.inl_f(x), torch.full((4,), 3.0)))
        self.assertTrue(torch.equal(m.inl_f(x), torch.full((4,), 3.0)))  # torch in, torch out

    @need_numpy
    def test_the_default_runtime_and_the_readme_block(self):
        """The README's load_inline block, as written (default runtime)."""
        block = readme_block('m = opjit.load_inline("scale2", SRC)')
        out = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True,
                             timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("[2. 4. 6.]", out.stdout)
        self.assertIn("scale2(Tensor x, float k=2.0) -> Tensor", out.stdout)


if __name__ == "__main__":
    unittest.main()
