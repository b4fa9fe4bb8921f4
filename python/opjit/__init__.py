"""opjit: load tensor operators from source at run time, call them on
PyTorch, NumPy or any DLPack tensors without copying.

    import opjit, torch
    nms = opjit.load_op("nms")                  # compiles ops-src/nms.c on first use
    keep = nms(boxes, scores, 0.5)              # or nms(boxes=..., scores=..., iou_threshold=0.5)
    nms.schema, nms.name, nms.devices, nms.tier, nms.sources
    opjit.list_ops()                            # the loaded ops
    rt = opjit.Runtime(ops_path=["my_ops"], cache_dir="/tmp/c", tiering=True)
    opjit.register_torch("nms")                 # -> torch.ops.opjit.nms

Outputs come back in the framework of the first tensor argument (torch in,
torch out; numpy in, numpy out), sharing opjit's memory. A failed load or
call raises opjit.Error (CompileError, NotFoundError, CallError (also a
TypeError), KernelError, DeviceError) with the runtime's message.
"""
import _thread
import atexit as _atexit

try:
    from ._opjit import (  # noqa: F401
        CallError,
        CompileError,
        DeviceError,
        DLPackTensor,
        Error,
        KernelError,
        NotFoundError,
        Op,
        Runtime,
        library_version,
    )
    from . import _opjit
except ImportError as _e:  # the source tree's python/opjit has no built extension
    raise ImportError(
        "opjit's extension module opjit._opjit is not next to %s: build it with cmake "
        "(build/python is importable) or install it (cmake --install build)" % __file__
    ) from _e

__version__ = library_version

__all__ = [
    "load_op", "list_ops", "default_runtime", "register_torch", "Runtime", "Op",
    "DLPackTensor", "Error", "CompileError", "NotFoundError", "CallError", "KernelError",
    "DeviceError",
]

_default = None
_default_lock = _thread.allocate_lock()  # not threading: its import costs milliseconds


def default_runtime():
    """The runtime load_op() and list_ops() use, made on first use with
    opjit's defaults (the OPJIT_* environment variables)."""
    global _default
    rt = _default
    if rt is None:
        with _default_lock:
            if _default is None:
                _default = Runtime()
            rt = _default
    return rt


def load_op(spec):
    """Load an op into the default runtime: a name on the search path
    ("nms") or a source path ("ops-src/nms.c"). Returns an opjit.Op."""
    return default_runtime().load_op(spec)


def list_ops():
    """The ops loaded into the default runtime, in load order."""
    return default_runtime().list_ops()


@_atexit.register
def _drop_default_runtime():
    # Destroying the runtime lets background optimizing compiles finish and
    # reach the cache, so the next process starts on the optimized code.
    global _default
    _default = None


def _torch_cuda_stream(device_index):
    """cudaStream_t of torch's current stream on a device: opjit runs calls
    on torch CUDA tensors there, ordered with the surrounding torch work."""
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


_opjit._set_torch_stream_hook(_torch_cuda_stream)

# ---- torch.library ---------------------------------------------------------

_torch_libraries = {}   # namespace -> torch.library.Library (kept alive: it owns the registrations)
_torch_registered = {}  # (namespace, name) -> (schema, Op)
_torch_lock = _thread.allocate_lock()


def _torch_library(torch, namespace):
    lib = _torch_libraries.get(namespace)
    if lib is None:
        try:
            lib = torch.library.Library(namespace, "DEF")
        except RuntimeError:
            # The namespace is defined elsewhere already: add to it.
            lib = torch.library.Library(namespace, "FRAGMENT")
        _torch_libraries[namespace] = lib
    return lib


def _register_fake(torch, lib, qualname, name, fake):
    if hasattr(torch.library, "register_fake"):      # torch >= 2.4
        torch.library.register_fake(qualname, fake, lib=lib)
    elif hasattr(torch.library, "impl_abstract"):    # torch 2.1 - 2.3
        torch.library.impl_abstract(qualname, fake, lib=lib)
    else:                                            # torch 1.13, 2.0
        lib.impl(name, fake, "Meta")
        # torch 1.13 has no fallthrough for meta tensors' autograd key.
        lib.impl(name, fake, "AutogradMeta")


def register_torch(op, namespace="opjit", *, runtime=None, fake=None):
    """Define op (an opjit.Op, or a name or path loaded into runtime, by
    default the default runtime) as torch.ops.<namespace>.<name>, with its
    schema, implemented for CPU and, where the op has a CUDA kernel, CUDA.
    It can then be called from Python and from torch.jit.script code.

    fake: an optional shape function (same arguments, returns empty tensors
    of the output shapes) registered as the op's fake/meta implementation,
    which torch.compile needs to trace it (torch 2.x). opjit ops declare no
    output-shape rule, so none is registered without it.

    Registering the same op again returns the same torch op; another schema
    under a registered name raises opjit.Error (torch cannot redefine an op).
    Returns the torch op (an OpOverloadPacket)."""
    import torch
    if not isinstance(op, Op):
        op = (runtime or default_runtime()).load_op(op)
    name, schema = op.name, op.schema
    key = (namespace, name)
    with _torch_lock:
        known = _torch_registered.get(key)
        if known is not None:
            if known[0] != schema:
                raise Error("%s::%s is registered with torch as %r; torch cannot redefine it as %r"
                            % (namespace, name, known[0], schema))
        else:
            lib = _torch_library(torch, namespace)
            lib.define(schema)
            for device, key_name in (("cpu", "CPU"), ("cuda", "CUDA")):
                if device in op.devices:
                    lib.impl(name, op, key_name)
            if fake is not None:
                _register_fake(torch, lib, "%s::%s" % (namespace, name), name, fake)
            _torch_registered[key] = (schema, op)
    return getattr(getattr(torch.ops, namespace), name)
