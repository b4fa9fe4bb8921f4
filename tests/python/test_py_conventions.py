"""Python conventions: type stubs and py.typed next to the package, agreeing
with what it exports; help(op) and op.__doc__ show the schema and the doc;
inspect.signature(op) comes from the schema and binds like a call;
opjit.Runtime is a context manager whose close() waits for calls in flight
and leaves its ops raising opjit.Error, outputs intact."""
import ast
import inspect
import os
import pydoc
import threading
import time
import unittest

import opjit
from opjit_testing import TEST_OPS, need_numpy, np, runtime

PKG = os.path.dirname(opjit.__file__)


class Stubs(unittest.TestCase):
    def stub_names(self):
        with open(os.path.join(PKG, "__init__.pyi"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        names = {}
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                names[node.name] = node
            elif isinstance(node, ast.AnnAssign):
                names[node.target.id] = node
        return names

    def test_py_typed_and_stubs_are_installed_with_the_package(self):
        self.assertTrue(os.path.isfile(os.path.join(PKG, "py.typed")))
        self.assertTrue(os.path.isfile(os.path.join(PKG, "__init__.pyi")))

    def test_the_stubs_cover_what_the_package_exports(self):
        names = self.stub_names()
        for name in opjit.__all__ + ["__version__"]:
            self.assertIn(name, names, "%s is exported but not in __init__.pyi" % name)
            self.assertTrue(hasattr(opjit, name))
        for cls in ("Op", "Runtime", "InlineModule"):
            for item in names[cls].body:
                if isinstance(item, ast.FunctionDef) and not item.name.startswith("__"):
                    self.assertTrue(hasattr(getattr(opjit, cls), item.name),
                                    "%s.%s is in the stubs only" % (cls, item.name))
        # Every function of the stub has the package's parameters.
        for name in ("load_inline", "register_torch", "load_op"):
            stub = [a.arg for a in names[name].args.args + names[name].args.kwonlyargs]
            real = list(inspect.signature(getattr(opjit, name)).parameters)
            self.assertEqual(stub, real, name)


class Docs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = runtime()
        cls.scalars = cls.rt.load_op(os.path.join(TEST_OPS, "scalars.c"))
        cls.fill = cls.rt.load_op(os.path.join(TEST_OPS, "fill.c"))

    @classmethod
    def tearDownClass(cls):
        cls.rt.close()

    def test_doc_and_help_show_the_schema_and_the_doc(self):
        self.assertEqual(self.fill.__doc__, self.fill.schema + "\n\nin place")
        self.assertRegex(self.fill.schema, r"^fill\(Tensor(\(a!\))? self, float value\) -> Tensor$")
        page = pydoc.render_doc(self.fill, renderer=pydoc.plaintext)
        self.assertIn(self.fill.schema, page)
        self.assertIn("in place", page)
        self.assertEqual(self.fill.__name__, "fill")
        # The class keeps its own doc.
        self.assertIn("A loaded operator", opjit.Op.__doc__)

    def test_signature_from_the_schema(self):
        sig = inspect.signature(self.scalars)
        self.assertEqual(str(sig), "(i: 'int', f: 'float', b: 'bool', l: 'int[2]', "
                                   "t: 'Tensor?' = None, k: 'int' = 7) -> 'Tensor'")
        P = inspect.Parameter
        self.assertTrue(all(p.kind is P.POSITIONAL_OR_KEYWORD for p in sig.parameters.values()))
        bound = sig.bind(1, 2.0, True, [1, 2], k=3)
        self.assertEqual(bound.arguments["k"], 3)
        with self.assertRaises(TypeError):
            sig.bind(1)
        self.assertRegex(str(inspect.signature(self.fill)),
                         r"^\(self: 'Tensor(\(a!\))?', value: 'float'\) -> 'Tensor'$")

    def test_signature_defaults_are_python_values(self):
        src = ("#include <opjit_op.h>\n"
               "static int k(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }\n"
               "OPJIT_MODULE(defs, m) { opjit_def(m, \"defs(Tensor x, float eps=1e-6, "
               "int[2] pad=[1, 1], bool flag=True, Tensor? w=None) -> (Tensor, Tensor)\", "
               "OPJIT_CPU, k, \"defaults\"); }\n")
        op = opjit.load_inline("defs", src, runtime=self.rt).defs
        params = inspect.signature(op).parameters
        self.assertEqual([params[n].default for n in ("eps", "pad", "flag", "w")],
                         [1e-6, [1, 1], True, None])
        self.assertEqual(inspect.signature(op).return_annotation, "(Tensor, Tensor)")


class Close(unittest.TestCase):
    @need_numpy
    def test_a_context_manager_closes_the_runtime(self):
        with runtime() as rt:
            self.assertFalse(rt.closed)
            fill = rt.load_op(os.path.join(TEST_OPS, "fill.c"))
            out = fill(np.zeros(3, np.float32), 2.0)
        self.assertTrue(rt.closed)
        np.testing.assert_array_equal(out, [3])   # outputs outlive the runtime
        with self.assertRaisesRegex(opjit.Error, "closed"):
            fill(np.zeros(3, np.float32), 2.0)
        with self.assertRaisesRegex(opjit.Error, "closed"):
            fill.schema
        with self.assertRaisesRegex(opjit.Error, "closed"):
            rt.load_op(os.path.join(TEST_OPS, "fill.c"))
        with self.assertRaisesRegex(opjit.Error, "closed"):
            opjit.load_inline("x", "int x;", runtime=rt)
        rt.close()   # twice is fine
        self.assertEqual(repr(fill.name), "'fill'")

    @need_numpy
    def test_close_waits_for_calls_in_flight(self):
        rt = runtime()
        sleep = rt.load_op(os.path.join(TEST_OPS, "sleep_ms.c"))
        x = np.zeros(1, np.float32)
        results, started = [], threading.Event()

        def caller():
            started.set()
            try:
                for _ in range(1000):
                    results.append(sleep(x, 20))
            except opjit.Error as e:
                results.append(e)

        t = threading.Thread(target=caller)
        t.start()
        started.wait()
        time.sleep(0.05)
        t0 = time.monotonic()
        rt.close()
        waited = time.monotonic() - t0
        t.join(30)
        self.assertFalse(t.is_alive())
        self.assertIsInstance(results[-1], opjit.Error)
        self.assertIn("closed", str(results[-1]))
        self.assertTrue(all(isinstance(r, np.ndarray) for r in results[:-1]))
        self.assertLess(waited, 5.0)


if __name__ == "__main__":
    unittest.main()
