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
call raises opjit.Error, a RuntimeError as torch's errors are
(CompileError, NotFoundError, CallError (also a TypeError), KernelError,
DeviceError), with the runtime's message.
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
        TensorMeta,
        library_version,
    )
    from . import _opjit
    from . import _log  # noqa: F401  (runtime messages -> logging.getLogger("opjit"))
    from ._inline import InlineModule, load_inline  # noqa: F401
except ImportError as _e:  # the source tree's python/opjit has no built extension
    raise ImportError(
        "opjit's extension module opjit._opjit is not next to %s: build it with cmake "
        "(build/python is importable) or install it (cmake --install build)" % __file__
    ) from _e

__version__ = library_version

__all__ = [
    "load_op", "load_inline", "InlineModule", "list_ops", "default_runtime", "register_torch",
    "Runtime", "Op", "DLPackTensor", "TensorMeta", "Error", "CompileError", "NotFoundError",
    "CallError", "KernelError",
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


def register_torch(op, namespace="opjit", *, runtime=None, fake=None):
    """Define op (an opjit.Op, or a name or path loaded into runtime, by
    default the default runtime) as torch.ops.<namespace>.<name>: a torch op
    with its schema and opjit's CPU and (where it has one) CUDA kernels,
    callable from Python, torch.jit.script and torch.compile code. Its
    overloads loaded beside it (conv2d.padding) and the backward ops its
    gradient declares are registered with it.

    From what the op's source declares (Op.declarations): its shape rule
    becomes the fake kernel torch.compile traces with (a size that depends
    on the data becomes a new unbacked size, at most the rule's bound); its
    derivative becomes its autograd formula (torch.library.register_autograd:
    the backward op runs with the saved inputs and an output_mask from
    ctx.needs_input_grad); "not differentiable" outputs do not require
    grad; an op that declares no gradient raises RuntimeError when a
    gradient reaches it. torch before 2.4 (Debian's 1.13) gets the schema,
    the kernels, a meta kernel from the shape rule and the derivative
    through an autograd.Function.

    fake: a shape function (the op's arguments -> empty tensors of the
    output shapes) to use instead of the shape rule.

    namespace must be a Python identifier (ValueError otherwise).
    Registering the same op again returns the same torch op; another op
    under a registered name raises opjit.Error: another schema (torch cannot
    redefine an op), or the same schema from another runtime or source
    (torch.ops.<namespace>.<name> keeps calling the first: register the
    other under another namespace). Returns the torch op (an
    OpOverloadPacket)."""
    from . import _torch
    return _torch.register(op, namespace, runtime, fake)
