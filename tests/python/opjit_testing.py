"""Shared by the Python tests (tests/python/test_py_*.py).

ctest runs each file with PYTHONPATH=<build>/python (the package as built),
OPJIT_OPS_PATH=<source>/ops-src and an empty OPJIT_CACHE_DIR of its own.
"""
import os
import unittest

import opjit

HERE = os.path.dirname(os.path.abspath(__file__))
TEST_OPS = os.path.join(HERE, "ops")
ROOT = os.path.dirname(os.path.dirname(HERE))
OPS_SRC = os.path.join(ROOT, "ops-src")

try:
    import numpy as np
except ImportError:  # pragma: no cover - Debian's python3-numpy is a test dependency
    np = None
try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover
    torch = F = None
try:
    import torchvision
except ImportError:  # pragma: no cover
    torchvision = None

need_numpy = unittest.skipIf(np is None, "numpy is not installed (python3-numpy)")
need_torch = unittest.skipIf(torch is None, "torch is not installed (python3-torch)")
need_torchvision = unittest.skipIf(torchvision is None,
                                   "torchvision is not installed (python3-torchvision)")


def runtime(**kw):
    """A runtime finding the test ops and the shipped ones. Tiering is off
    unless asked for: the libtcc code serves, and no cc runs behind."""
    kw.setdefault("tiering", False)
    return opjit.Runtime(ops_path=[TEST_OPS, OPS_SRC], **kw)


def random_boxes(n, seed, dtype="float32", ties=False):
    """numpy boxes [n, 4] (x1, y1, x2, y2) in [0, 200) and scores [n].
    ties: scores drawn from a few values, and some boxes repeated."""
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 150, size=(n, 2))
    wh = rng.uniform(1, 50, size=(n, 2))
    boxes = np.concatenate([xy, xy + wh], axis=1).astype(dtype)
    scores = rng.uniform(0, 1, size=n).astype(dtype)
    if ties and n > 4:
        scores = rng.integers(0, 4, size=n).astype(dtype) / 4
        boxes[n // 2:n // 2 + 2] = boxes[:2]
    return boxes, scores


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
