"""bench/inline_bench.py - ops from a string, side by side (bench/run --only
inline): opjit.load_inline of a small C op against
torch.utils.cpp_extension.load_inline of the same op in C++ and tvm-ffi's
load_inline, cold (empty caches) and cached, each in a fresh interpreter;
then the per-call cost through the Python front on tiny inputs, opjit's op
against the tvm-ffi function doing the same work, on numpy and on torch.

It runs under an interpreter with torch 2.x, tvm-ffi (apache-tvm-ffi) and
ninja: $OPJIT_BENCH_TORCH2_PY, else ~/.cache/opjit-dev/torch2/bin/python
(bench.py calls `main` there through a subprocess and reads its JSON); opjit
is build/python (the extension works under any CPython 3.11 patch level).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TORCH2_PY = os.environ.get("OPJIT_BENCH_TORCH2_PY",
                           os.path.expanduser("~/.cache/opjit-dev/torch2/bin/python"))
TINY = 8
GOALS = {"vs_cpp_extension": 1000.0, "vs_tvm_ffi": 100.0, "hit_ms": 2.0}
# bench/run --smoke: one cached load of each anchor, short per-call loops.
SMOKE = os.environ.get("OPJIT_BENCH_SMOKE") == "1"

OPJIT_SRC = r"""
#include <opjit_op.h>

static int scale2_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    DLTensor *y = opjit_output(ctx, 0, x->dtype, x->ndim, x->shape);
    if (!y)
        return -1;
    const float *xs = opjit_data(x);
    float *ys = y->data;
    for (int64_t i = 0; i < opjit_numel(x); i++)
        ys[i] = 2 * xs[i];
    return 0;
}

OPJIT_MODULE(m)
{
    opjit_def(m, "scale2(Tensor x) -> Tensor", OPJIT_CPU, scale2_cpu, "x times 2");
    opjit_require(m, "x", "float32 contiguous");
}
"""

TORCH_SRC = r"""
#include <torch/extension.h>

torch::Tensor scale2(torch::Tensor x)
{
    auto y = torch::empty_like(x);
    const float *xs = x.data_ptr<float>();
    float *ys = y.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); i++)
        ys[i] = 2 * xs[i];
    return y;
}
"""

TVM_SRC = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>

void scale2(tvm::ffi::TensorView x, tvm::ffi::TensorView y)
{
    const float *xs = static_cast<const float *>(x.data_ptr());
    float *ys = static_cast<float *>(y.data_ptr());
    for (int64_t i = 0; i < x.size(0); i++)
        ys[i] = 2 * xs[i];
}
"""

# Each load runs in a fresh interpreter: the import and the load timed apart.
LOADERS = {
    "opjit": r"""
import sys, time
t0 = time.perf_counter()
import opjit
t1 = time.perf_counter()
m = opjit.load_inline("scale2", sys.stdin.read(), runtime=opjit.Runtime(tiering=False))
t2 = time.perf_counter()
""",
    "cpp_extension": r"""
import sys, time
t0 = time.perf_counter()
import torch.utils.cpp_extension as ce
t1 = time.perf_counter()
m = ce.load_inline("opjit_bench_scale2", cpp_sources=[sys.stdin.read()], functions=["scale2"],
                   build_directory=sys.argv[1], extra_cflags=["-O2"])
t2 = time.perf_counter()
""",
    "tvm_ffi": r"""
import sys, time
t0 = time.perf_counter()
import tvm_ffi.cpp
t1 = time.perf_counter()
m = tvm_ffi.cpp.load_inline("opjit_bench_scale2", cpp_sources=sys.stdin.read(),
                            functions=["scale2"], build_directory=sys.argv[1])
t2 = time.perf_counter()
""",
}
REPORT = r"""
import json
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "load_ms": (t2 - t1) * 1e3}))
"""
SOURCES = {"opjit": OPJIT_SRC, "cpp_extension": TORCH_SRC, "tvm_ffi": TVM_SRC}


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def load_once(kind, build_dir, env):
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", LOADERS[kind] + REPORT, build_dir],
                       input=SOURCES[kind], capture_output=True, text=True, env=env,
                       timeout=1800)
    wall = (time.perf_counter() - t0) * 1e3
    if p.returncode:
        raise RuntimeError("%s: %s" % (kind, p.stderr.strip()[-400:]))
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["wall_ms"] = wall
    return out


def bench_loads(reps, tmp):
    """Cold (empty cache or build directory) then cached, each in a fresh
    interpreter; opjit reps times, the anchors (seconds each) once cold and
    three times cached."""
    res = {}
    env = dict(os.environ, OPJIT_TIERING="0")
    for kind, n in (("opjit", reps), ("cpp_extension", 1), ("tvm_ffi", 1)):
        cold, hit = [], []
        try:
            for r in range(n + (kind == "opjit")):  # opjit: the first warms the page cache
                d = tempfile.mkdtemp(prefix="inline-%s-" % kind, dir=tmp)
                e = dict(env, OPJIT_CACHE_DIR=d, TVM_FFI_CACHE_DIR=d,
                         TORCH_EXTENSIONS_DIR=d)
                c = load_once(kind, d, e)
                h = [load_once(kind, d, e) for _ in range(1 if kind == "opjit" or SMOKE else 3)]
                if kind != "opjit" or r:
                    cold.append(c)
                    hit.extend(h)
        except (RuntimeError, ValueError, subprocess.TimeoutExpired, ImportError) as err:
            res[kind] = {"error": str(err)[-300:]}
            continue
        res[kind] = {f: median([x[f] for x in xs])
                     for f in ("load_ms", "import_ms", "wall_ms")
                     for xs in (cold,)}
        res[kind].update({"hit_" + f: median([x[f] for x in hit])
                          for f in ("load_ms", "import_ms", "wall_ms")})
        res[kind]["n_cold"], res[kind]["n_hit"] = len(cold), len(hit)
    o = res.get("opjit", {})
    for kind in ("cpp_extension", "tvm_ffi"):
        if "load_ms" in o and "load_ms" in res.get(kind, {}):
            res["cold_ratio_" + kind] = res[kind]["load_ms"] / o["load_ms"]
    return res


def per_call_us(fn, reps, inner=20000):
    """Median over reps of the mean time of one call in a loop of inner."""
    inner = 1000 if SMOKE else inner
    for _ in range(1000):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner * 1e6)
    return median(times)


def bench_calls(reps, tmp):
    import numpy as np
    import torch
    import opjit
    import tvm_ffi.cpp
    torch.set_num_threads(1)
    rt = opjit.Runtime(cache_dir=os.path.join(tmp, "calls-cache"), tiering=True)
    op = opjit.load_inline("scale2", OPJIT_SRC, runtime=rt).scale2
    rt.wait()
    tv = tvm_ffi.cpp.load_inline("opjit_bench_scale2", cpp_sources=TVM_SRC, functions=["scale2"],
                                 build_directory=tempfile.mkdtemp(prefix="tvm-calls-", dir=tmp))
    f = tv.scale2
    xn = np.arange(TINY, dtype=np.float32)
    xt = torch.arange(TINY, dtype=torch.float32)
    yn, yt = np.empty_like(xn), torch.empty_like(xt)
    assert np.array_equal(op(xn), 2 * xn) and torch.equal(op(xt), 2 * xt)
    f(xn, yn)
    f(xt, yt)
    assert np.array_equal(yn, 2 * xn) and torch.equal(yt, 2 * xt)
    res = {"tier": op.tier}
    # Interleaved rounds: each side measured in every round.
    cases = {
        "opjit_numpy": lambda: op(xn),
        "tvm_numpy_alloc": lambda: f(xn, np.empty_like(xn)),
        "tvm_numpy_prealloc": lambda: f(xn, yn),
        "opjit_torch": lambda: op(xt),
        "tvm_torch_alloc": lambda: f(xt, torch.empty_like(xt)),
        "tvm_torch_prealloc": lambda: f(xt, yt),
        "empty_like_numpy": lambda: np.empty_like(xn),
        "empty_like_torch": lambda: torch.empty_like(xt),
    }
    rounds = {k: [] for k in cases}
    for _ in range(reps):
        for k, fn in cases.items():
            rounds[k].append(per_call_us(fn, 1))
    res.update({k: median(v) for k, v in rounds.items()})
    rt.close()
    return res


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    tmp = tempfile.mkdtemp(prefix="opjit-inline-bench-")
    import tvm_ffi
    import torch
    out = {"python": sys.version.split()[0], "torch": torch.__version__,
           "tvm_ffi": getattr(tvm_ffi, "__version__", "?")}
    out["loads"] = bench_loads(reps, tmp)
    out["calls"] = bench_calls(reps, tmp)
    print(json.dumps(out))


# ---- bench.py's side ----------------------------------------------------------

def bench(reps, tmp):
    """Run main() under the torch 2 interpreter; its results, or why not."""
    if not os.path.exists(TORCH2_PY):
        return {"missing": "no interpreter with torch 2 at %s (OPJIT_BENCH_TORCH2_PY)" % TORCH2_PY}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "build", "python")
    p = subprocess.run([TORCH2_PY, os.path.abspath(__file__), str(reps)], capture_output=True,
                       text=True, env=env, timeout=3600, cwd=tmp)
    if p.returncode:
        return {"missing": "bench/inline_bench.py failed: %s" % p.stderr.strip()[-400:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def rows(R, fms):
    """(metric, opjit, anchor, ratio, goal, met) rows for latest.md."""
    if not R or "missing" in R:
        return [("ops from a string (`--only inline`)", "n/a", (R or {}).get("missing", "not run"),
                 "", "", "")]
    L, C, out = R["loads"], R["calls"], []
    o = L.get("opjit", {})
    for kind, label, goal in (("cpp_extension", "`torch.utils.cpp_extension.load_inline` "
                               "(C++, g++ + ninja, torch %s)" % R["torch"], "vs_cpp_extension"),
                              ("tvm_ffi", "tvm-ffi %s `load_inline` (g++)" % R["tvm_ffi"],
                               "vs_tvm_ffi")):
        a = L.get(kind, {})
        if "load_ms" not in a or "load_ms" not in o:
            out.append(("cold load of a small C op from a string, fresh interpreter", "n/a",
                        label + ": " + a.get("error", o.get("error", "n/a"))[:160], "", "", ""))
            continue
        r = a["load_ms"] / o["load_ms"]
        out.append(("cold `opjit.load_inline` of a small C op, fresh interpreter, empty cache",
                    fms(o["load_ms"]) + " (import: %s)" % fms(o["import_ms"]),
                    "%s: %s" % (label, fms(a["load_ms"])), "%.0fx faster" % r,
                    ">= %.0fx" % GOALS[goal], "yes" if r >= GOALS[goal] else "**no**"))
    if "hit_load_ms" in o:
        anchors = "; ".join("%s: %s" % (k, fms(L[k]["hit_load_ms"])) for k in
                            ("cpp_extension", "tvm_ffi") if "hit_load_ms" in L.get(k, {}))
        out.append(("cache hit of `opjit.load_inline`, fresh interpreter",
                    fms(o["hit_load_ms"]) + " (+ import %s)" % fms(o["hit_import_ms"]),
                    "the anchors' load_inline, built already: " + anchors, "",
                    "<= %.0f ms + import" % GOALS["hit_ms"],
                    "yes" if o["hit_load_ms"] <= GOALS["hit_ms"] else "**no**"))
    for fw in ("numpy", "torch"):
        mine, alloc, pre = C["opjit_" + fw], C["tvm_%s_alloc" % fw], C["tvm_%s_prealloc" % fw]
        out.append(("per call, x * 2 on %d float32 (%s in/out), opjit op from Python (%s tier)"
                    % (TINY, fw, C["tier"]), "%.2f µs" % mine,
                    "tvm-ffi function, output allocated per call (`empty_like`: %.2f µs): %.2f µs; "
                    "preallocated once: %.2f µs" % (C["empty_like_" + fw], alloc, pre),
                    "%.2fx tvm-ffi's time (%.2fx preallocated)" % (mine / alloc, mine / pre),
                    "<= 1x", "yes" if mine <= alloc else "**no**"))
    return out


HOW = """
- Ops from a string (`bench/inline_bench.py`, `--only inline`), under the
  torch 2 interpreter (`OPJIT_BENCH_TORCH2_PY`, default
  `~/.cache/opjit-dev/torch2/bin/python`, with apache-tvm-ffi and ninja):
  the same `x * 2` op as a C string for `opjit.load_inline`, as C++ for
  `torch.utils.cpp_extension.load_inline` (pybind11 bindings) and for
  tvm-ffi's `load_inline`. Each load runs in a fresh interpreter: cold
  with an empty cache or build directory (opjit: median of the reps, each
  after one dropped run; the anchors: once), then cached in another fresh
  interpreter with that directory. The time is the load call alone; the
  import of each package is given apart. Per call: median over the reps
  of interleaved rounds of 20,000 calls on 8 float32s; the opjit op
  allocates its output (opjit's allocator, numpy/torch take it over
  DLPack), the tvm-ffi function writes into an output the caller
  allocates, per call (`np.empty_like`/`torch.empty_like`: the same work)
  or once.
"""


def md_section(R, fms):
    lines = []
    if not R or "missing" in R:
        return lines
    L = R["loads"]
    lines += ["", "### Ops from a string (Python %s, torch %s, tvm-ffi %s)" % (
        R["python"], R["torch"], R["tvm_ffi"]), "",
        "| load, fresh interpreter | cold: load | import | cached: load | import |",
        "| --- | --- | --- | --- | --- |"]
    for kind in ("opjit", "cpp_extension", "tvm_ffi"):
        a = L.get(kind, {})
        if "load_ms" in a:
            lines.append("| %s | %s | %s | %s | %s |" % (
                kind, fms(a["load_ms"]), fms(a["import_ms"]), fms(a["hit_load_ms"]),
                fms(a["hit_import_ms"])))
        else:
            lines.append("| %s | n/a: %s | | | |" % (kind, a.get("error", "?")[:160]))
    C = R["calls"]
    lines += ["", "| per call, 8 float32 (µs) | numpy | torch |", "| --- | --- | --- |"]
    for k, label in (("opjit_%s", "opjit op (allocates its output)"),
                     ("tvm_%s_alloc", "tvm-ffi, output `empty_like` per call"),
                     ("tvm_%s_prealloc", "tvm-ffi, output preallocated"),
                     ("empty_like_%s", "`empty_like` alone")):
        lines.append("| %s | %.2f | %.2f |" % (label, C[k % "numpy"], C[k % "torch"]))
    return lines


if __name__ == "__main__":
    main()
