"""Threads calling ops concurrently get their own right answers, and loads
and calls release the GIL: other Python threads run while a kernel runs or
a source compiles."""
import sys
import tempfile
import threading
import time
import unittest

import opjit
from opjit_testing import need_numpy, need_torch, np, random_boxes, runtime, torch


class Counter(threading.Thread):
    """Counts while it gets the GIL; sleeps a little between counts (which
    releases the GIL, so the main thread is never held up by it)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.n = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.n += 1
            time.sleep(0.0002)


def while_counting(fn):
    """Run fn() with a Counter running: how often it counted meanwhile.
    A long switch interval keeps Python from taking the GIL away from this
    thread: the Counter runs only where fn gives the GIL up."""
    old = sys.getswitchinterval()
    c = Counter()
    c.start()
    time.sleep(0.02)
    sys.setswitchinterval(30.0)
    try:
        before = c.n
        fn()
        during = c.n - before
    finally:
        sys.setswitchinterval(old)
        c.stop.set()
        c.join()
    return during


@need_numpy
class TestThreads(unittest.TestCase):
    def test_concurrent_calls_give_each_thread_its_result(self):
        rt = runtime()
        nms, mm = rt.load_op("nms"), rt.load_op("mm")
        jobs = []
        for t in range(6):
            b, s = random_boxes(300 + 50 * t, 100 + t)
            a = np.random.default_rng(t).standard_normal((20, 30)).astype(np.float32)
            jobs.append((b, s, nms(b, s, 0.5), a, mm(a, a.T)))
        errors = []
        barrier = threading.Barrier(len(jobs))

        def work(b, s, keep, a, prod):
            try:
                barrier.wait()
                for _ in range(300):
                    if not np.array_equal(nms(b, s, 0.5), keep):
                        errors.append("nms result differs")
                    if not np.array_equal(mm(a, a.T), prod):
                        errors.append("mm result differs")
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
        threads = [threading.Thread(target=work, args=j) for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])

    def test_calls_release_the_gil(self):
        sleep_ms = runtime().load_op("sleep_ms")
        x = np.zeros(1, np.float32)
        self.assertGreater(while_counting(lambda: sleep_ms(x, 150)), 5)
        # Four threads sleeping 200 ms in a kernel each take about 200 ms.
        threads = [threading.Thread(target=sleep_ms, args=(x, 200)) for _ in range(4)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertLess(time.monotonic() - t0, 0.6)

    def test_loads_release_the_gil(self):
        with tempfile.TemporaryDirectory() as cache:
            rt = runtime(cache_dir=cache)  # empty: every load compiles

            def load_all():
                for name in ("conv2d", "mm", "nms", "probe", "fill", "minmax"):
                    rt.load_op(name)
            self.assertGreater(while_counting(load_all), 3)

    def test_concurrent_loads_of_one_op(self):
        with tempfile.TemporaryDirectory() as cache:
            rt = runtime(cache_dir=cache)
            got, errors = [], []

            def load():
                try:
                    got.append(rt.load_op("conv2d"))
                except opjit.Error as e:
                    errors.append(str(e))
            threads = [threading.Thread(target=load) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(errors, [])
            self.assertEqual(len(got), 4)
            self.assertTrue(all(op == got[0] for op in got))
            names = [op.name for op in rt.list_ops()]  # conv2d.c's ops, each once
            self.assertEqual(names[0], "conv2d")
            self.assertEqual(len(names), len(set(names)))

    @need_torch
    def test_torch_tensors_from_threads(self):
        nms = runtime().load_op("nms")
        b, s = random_boxes(500, 9)
        bt, st = torch.from_numpy(b), torch.from_numpy(s)
        want = nms(bt, st, 0.4)
        bad = []

        def work():
            for _ in range(500):
                if not torch.equal(nms(bt, st, 0.4), want):
                    bad.append(1)
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(bad, [])


if __name__ == "__main__":
    unittest.main()
