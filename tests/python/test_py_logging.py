"""The runtime's messages reach logging.getLogger("opjit"): warnings by
default (an unwritable cache says so once, as the CLI does, instead of
recompiling silently in every process), INFO and DEBUG when the logger asks
for them; messages of the library's own threads (the optimizing tier's
worker) arrive on the main thread without a call into opjit; many threads
logging at once neither deadlock nor lose messages."""
import logging
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import unittest

import opjit
from opjit_testing import OPS_SRC, TEST_OPS, need_numpy, np, runtime


def run_python(code, env=None, timeout=180):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, **(env or {})))


class Logging(unittest.TestCase):
    def test_an_unwritable_cache_warns_through_logging(self):
        with tempfile.TemporaryDirectory() as d:
            blocker = os.path.join(d, "file")
            open(blocker, "w").close()
            with self.assertLogs("opjit", logging.WARNING) as logs:
                rt = runtime(cache_dir=os.path.join(blocker, "cache"))
                op = rt.load_op(os.path.join(TEST_OPS, "fill.c"))
            rt.close()
        self.assertEqual(op.name, "fill")
        text = "\n".join(logs.output)
        self.assertIn("WARNING:opjit:", text)
        self.assertIn("is unusable", text)
        self.assertIn("nothing new is cached", text)

    def test_warnings_show_on_stderr_with_logging_unconfigured(self):
        """No logging set up at all: Python's last-resort handler prints
        WARNING and above on stderr, like the opjit command."""
        with tempfile.TemporaryDirectory() as d:
            blocker = os.path.join(d, "file")
            open(blocker, "w").close()
            r = run_python("""
                import sys, opjit
                rt = opjit.Runtime(cache_dir=%r)
                rt.load_op(%r)
                print("ok", "logging" in sys.modules)
            """ % (os.path.join(blocker, "cache"), os.path.join(TEST_OPS, "fill.c")))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("is unusable", r.stderr)
        # Importing opjit and loading did not import logging until a
        # message had to be delivered.
        self.assertIn("ok True", r.stdout)
        r = run_python("""
            import sys, opjit
            opjit.Runtime(tiering=False).load_op(%r)
            print("logging imported:", "logging" in sys.modules)
        """ % os.path.join(TEST_OPS, "fill.c"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("logging imported: False", r.stdout)
        self.assertEqual(r.stderr, "")

    def test_info_and_debug_when_the_logger_asks(self):
        logger = logging.getLogger("opjit")
        old = logger.level
        try:
            logger.setLevel(logging.DEBUG)
            with self.assertLogs("opjit", logging.DEBUG) as logs:
                rt = runtime()
                op = rt.load_op(os.path.join(TEST_OPS, "minmax.c"))
                if np is not None:
                    op(np.arange(4, dtype=np.float32))
            rt.close()
        finally:
            logger.setLevel(old)
        text = "\n".join(logs.output)
        self.assertRegex(text, r"INFO:opjit:loaded .*minmax\.c \(tcc, (compiled|cache hit)")
        if np is not None:
            self.assertIn("DEBUG:opjit:minmax: cpu kernel", text)
        # At the default level (WARNING) a runtime asks for no INFO at all.
        quiet = runtime()
        with self.assertNoLogs("opjit", logging.DEBUG):
            quiet.load_op(os.path.join(TEST_OPS, "minmax.c"))
        quiet.close()

    def test_a_library_thread_s_warning_reaches_the_main_thread(self):
        """The optimizing tier's worker thread logs that its compile failed
        (a cc that cannot compile); the warning is delivered on the main
        thread while it runs Python code, with no call into opjit."""
        with tempfile.TemporaryDirectory() as d:
            cc = os.path.join(d, "badcc")
            with open(cc, "w") as f:
                f.write('#!/bin/sh\ncase "$1" in --version) echo "badcc 1.0";;\n'
                        '*) echo "badcc: refusing" >&2; exit 1;; esac\n')
            os.chmod(cc, 0o755)
            r = run_python("""
                import logging, sys, threading, time, opjit
                got = []
                class H(logging.Handler):
                    def emit(self, rec):
                        got.append((rec.levelname, threading.current_thread().name,
                                    rec.getMessage()))
                logging.getLogger("opjit").addHandler(H())
                rt = opjit.Runtime(ops_path=[%r], tiering=True)
                rt.load_op("fill")
                deadline = time.monotonic() + 120
                while not got and time.monotonic() < deadline:
                    time.sleep(0.01)      # Python code runs; no opjit call
                for g in got:
                    print(*g, sep=" | ")
            """ % TEST_OPS, env={"OPJIT_CC": cc, "OPJIT_CACHE_DIR": os.path.join(d, "c")})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("WARNING | MainThread | ", r.stdout)
        self.assertIn("the code already loaded keeps serving it", r.stdout)

    def test_many_threads_loading_with_info_logging(self):
        logger = logging.getLogger("opjit")
        old = logger.level
        records = []

        class Collect(logging.Handler):
            def emit(self, rec):
                records.append(rec.getMessage())

        handler = Collect()
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            rt = runtime()
            errors = []

            def work(i):
                try:
                    for j in range(10):
                        rt.unload("fill") if j % 2 else None
                        rt.load_op(os.path.join(TEST_OPS, "fill.c"))
                except Exception as e:  # pragma: no cover - reported below
                    errors.append(e)

            threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            self.assertFalse(any(t.is_alive() for t in threads), "a thread hung")
            rt.close()
        finally:
            logger.removeHandler(handler)
            logger.setLevel(old)
        self.assertEqual([e for e in errors if not isinstance(e, opjit.NotFoundError)], [])
        self.assertGreaterEqual(sum("loaded" in r and "fill.c" in r for r in records), 4)


if __name__ == "__main__":
    unittest.main()
