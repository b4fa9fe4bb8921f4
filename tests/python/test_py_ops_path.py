"""Runtime(ops_path=[...]) naming a directory that does not exist warns
through warnings.warn, naming the directory (#24.4), as `opjit --ops-path`
warns on stderr: a typo would otherwise only show as "no source for op"
at the first load. Said once, not again through the "opjit" logger."""
import logging
import os
import tempfile
import unittest
import warnings

import opjit


class CapturingHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


class TestOpsPath(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.log = CapturingHandler()
        logger = logging.getLogger("opjit")
        logger.addHandler(self.log)
        self.addCleanup(logger.removeHandler, self.log)

    def test_missing_directory_warns(self):
        missing = os.path.join(self.tmp.name, "my_ops")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            opjit.Runtime(ops_path=[self.tmp.name, missing], tiering=False)
        texts = [str(w.message) for w in seen if issubclass(w.category, UserWarning)]
        self.assertEqual(len(texts), 1, texts)
        self.assertIn("'%s' does not exist" % missing, texts[0])
        self.assertEqual(seen[0].filename, __file__)  # points at the caller
        self.assertFalse([r for r in self.log.records if missing in r], self.log.records)

    def test_file_is_not_a_directory(self):
        path = os.path.join(self.tmp.name, "ops.c")
        open(path, "w").close()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            opjit.Runtime(ops_path=path, tiering=False)
        self.assertIn("is not a directory", str(seen[0].message))

    def test_existing_directories_are_quiet(self):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            opjit.Runtime(ops_path=[self.tmp.name], tiering=False)
        self.assertEqual([str(w.message) for w in seen], [])

    def test_warning_as_error_raises(self):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with self.assertRaises(UserWarning):
                opjit.Runtime(ops_path=[os.path.join(self.tmp.name, "nope")], tiering=False)


if __name__ == "__main__":
    unittest.main()
