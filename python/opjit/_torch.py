"""opjit ops as first-class torch ops (opjit.register_torch).

Each op is defined through torch.library with its schema (a Tensor(a!)
argument tells torch the op writes it), implemented for CPU and CUDA by
opjit's kernels, and, from what its source declares (Op.declarations):

- a fake kernel from its shape rule, so torch.compile can trace it (a size
  that depends on the data becomes an unbacked size, bounded by the rule);
- its autograd formula: a derivative calls the backward op (registered
  too) with what setup_context saved and output_mask from
  ctx.needs_input_grad; "not differentiable" gives outputs that do not
  require grad; an op that declares nothing raises torch's usual error
  when a gradient reaches it, never silently nothing.

torch 2.4 and later get all of it (register_fake, register_autograd);
older torch (Debian's 1.13) gets the schema, the kernels, a Meta kernel
from the shape rule and autograd through an autograd.Function at the
Autograd key.
"""
import keyword
import threading

from ._opjit import Error, Op, TensorMeta

_lock = threading.RLock()
_libraries = {}   # namespace -> torch.library.Library (kept: it owns the registrations)
_registered = {}  # (namespace, op name) -> Op


def _check_namespace(namespace):
    if not isinstance(namespace, str) or not namespace.isidentifier() or \
            keyword.iskeyword(namespace):
        raise ValueError("register_torch: namespace must be a Python identifier "
                         "(torch.ops.<namespace>), got %r" % (namespace,))


def _library(torch, namespace):
    lib = _libraries.get(namespace)
    if lib is None:
        try:
            lib = torch.library.Library(namespace, "DEF")
        except RuntimeError:  # the namespace is defined elsewhere already: add to it
            lib = torch.library.Library(namespace, "FRAGMENT")
        _libraries[namespace] = lib
    return lib


def _split(name):
    base, _, overload = name.partition(".")
    return base, overload or "default"


def _overload(torch, namespace, name):
    base, overload = _split(name)
    return getattr(getattr(getattr(torch.ops, namespace), base), overload)


# ---- which ops go together -----------------------------------------------------

def _family(op):
    """op, its overloads loaded beside it (conv2d.padding for conv2d), and
    the backward ops of each, recursively: [(Op, backward_of or None)]."""
    loaded = {o.name: o for o in op.runtime.list_ops()}
    base = _split(op.name)[0]
    todo = [(op, None)] + [(o, None) for n, o in loaded.items()
                           if n != op.name and _split(n)[0] == base]
    seen, out = set(), []
    while todo:
        o, of = todo.pop(0)
        if o.name in seen:
            continue
        seen.add(o.name)
        out.append((o, of))
        d = o.declarations
        if d["gradient"] == "derivative":
            b = loaded.get(d["backward"])
            if b is None:
                raise Error("%s: its backward op %s is not loaded" % (o.name, d["backward"]))
            todo.append((b, o.name))
    return out


# ---- fake kernels from shape rules --------------------------------------------------

def _meta(t):
    """A torch tensor (real, fake or meta) as an opjit.TensorMeta. Symbolic
    sizes are made concrete (torch.compile then specializes on them): a C
    shape rule computes with numbers."""
    dev = t.device
    return TensorMeta(tuple(int(s) for s in t.shape), str(t.dtype).replace("torch.", ""),
                      tuple(int(s) for s in t.stride()), dev.type, dev.index or 0)


def _make_fake(torch, op, dynamic_ok):
    def fake(*args, **kwargs):
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if first is None:
            first = next((a for a in kwargs.values() if isinstance(a, torch.Tensor)), None)
        metas = [_meta(a) if isinstance(a, torch.Tensor) else a for a in args]
        kmetas = {k: _meta(a) if isinstance(a, torch.Tensor) else a for k, a in kwargs.items()}
        outs = []
        for shape, dtype, dynamic in op.output_shapes(*metas, **kmetas):
            shape = list(shape)
            for d in dynamic:
                if not dynamic_ok:
                    raise NotImplementedError(
                        "%s: output size depends on the data; this torch cannot express that "
                        "in a meta kernel" % op.name)
                if shape[d] > 0:  # 0 stays 0: at most 0 is exactly 0
                    shape[d] = torch.library.get_ctx().new_dynamic_size(max=shape[d])
            dt = getattr(torch, dtype)
            if first is not None:
                outs.append(first.new_empty(shape, dtype=dt))
            else:
                outs.append(torch.empty(shape, dtype=dt))
        return outs[0] if len(outs) == 1 else tuple(outs)
    fake.__name__ = "opjit_fake_" + op.name.replace(".", "_")
    return fake


def _register_fake(torch, lib, namespace, name, fn):
    qualname = "%s::%s" % (namespace, name)
    if hasattr(torch.library, "register_fake"):      # torch >= 2.4
        torch.library.register_fake(qualname, fn, lib=lib)
    elif hasattr(torch.library, "impl_abstract"):    # torch 2.1 - 2.3
        torch.library.impl_abstract(qualname, fn, lib=lib)
    else:                                            # torch 1.13, 2.0
        lib.impl(name, fn, "Meta")
        # torch 1.13 has no fallthrough for meta tensors' autograd key.
        lib.impl(name, fn, "AutogradMeta")


# ---- autograd ---------------------------------------------------------------------

class _Plan:
    """How to call op's backward op: from Op.declarations and the torch
    schemas of both."""

    def __init__(self, torch, namespace, op):
        d = op.declarations
        self.qualname = "%s::%s" % (namespace, op.name)
        self.inputs = d["inputs"]
        self.backward = _overload(torch, namespace, d["backward"])
        fargs = _overload(torch, namespace, op.name)._schema.arguments
        bargs = self.backward._schema.arguments
        self.npositional = sum(1 for a in fargs if not a.kwarg_only)
        self.fnames = [a.name for a in fargs]
        self.fdefaults = [a.default_value if a.has_default_value() else None for a in fargs]
        # per backward argument: (name, from, index) but defaults (left to the op)
        self.args = [(bargs[i].name, frm, j) for i, (frm, j) in enumerate(d["backward_args"])
                     if frm != "default"]
        # the backward op's arguments in order: (name, keyword-only, default)
        self.bargs = [(a.name, a.kwarg_only, a.default_value if a.has_default_value() else None)
                      for a in bargs]

        # forward arguments the backward takes that are tensors: saved
        self.tensor_input = {j for _, frm, j in self.args
                             if frm == "input" and "Tensor" in str(fargs[j].type)}

    def forward_value(self, inputs, kwonly, j):
        """Forward argument j: given (positional or keyword-only), or its
        default (torch passes setup_context the arguments given only)."""
        if j < min(self.npositional, len(inputs)):
            return inputs[j]
        if j >= self.npositional and self.fnames[j] in kwonly:
            return kwonly[self.fnames[j]]
        return self.fdefaults[j]

    def save(self, ctx, inputs, kwonly, output):
        """setup_context: what the backward op takes from the forward."""
        outs = output if isinstance(output, tuple) else (output,)
        tensors, names, consts = [], [], {}
        for name, frm, j in self.args:
            if frm == "input" and j in self.tensor_input:
                tensors.append(self.forward_value(inputs, kwonly, j))
                names.append(name)
            elif frm == "input":
                consts[name] = self.forward_value(inputs, kwonly, j)
            elif frm == "output":
                tensors.append(outs[j])
                names.append(name)
        ctx.save_for_backward(*tensors)
        ctx.opjit_names = names
        ctx.opjit_consts = consts
        ctx.opjit_outs = [(o.shape, o.dtype, o.device) for o in outs]

    def run(self, torch, ctx, grads):
        """backward: the backward op's gradients, None where not wanted."""
        kwargs = dict(ctx.opjit_consts)
        kwargs.update(zip(ctx.opjit_names, ctx.saved_tensors))
        needs = ctx.needs_input_grad
        for name, frm, j in self.args:
            if frm == "grad":
                g = grads[j]
                if g is None:
                    shape, dtype, device = ctx.opjit_outs[j]
                    g = torch.zeros(shape, dtype=dtype, device=device)
                kwargs[name] = g.contiguous()
            elif frm == "mask":
                kwargs[name] = [int(i < len(needs) and bool(needs[i])) for i in self.inputs]
        # positional but for keyword-only arguments: torch 1.13's
        # OpOverload.__call__ takes a keyword named self (mm_backward's) amiss
        pos = [kwargs.get(n, dflt) for n, kwonly, dflt in self.bargs if not kwonly]
        kw = {n: kwargs[n] for n, kwonly, _ in self.bargs if kwonly and n in kwargs}
        res = self.backward(*pos, **kw)
        res = res if isinstance(res, (tuple, list)) else (res,)
        out = [None] * len(needs)  # one per input given
        for k, i in enumerate(self.inputs):
            if i < len(needs) and needs[i]:
                out[i] = res[k]
        return tuple(out)


def _no_derivative(qualname, backward_of):
    why = ("%s has no derivative: its module declares none (opjit_derivative)" % qualname)
    if backward_of:
        why += ", so %s, whose backward it is, is not twice differentiable" % backward_of

    def backward(ctx, *grads):
        raise RuntimeError(why)
    return backward, why


def _has_kwonly(torch, namespace, name):
    return any(a.kwarg_only for a in _overload(torch, namespace, name)._schema.arguments)


def _is_mutable(torch, namespace, name):
    return any(a.alias_info is not None and a.alias_info.is_write
               for a in _overload(torch, namespace, name)._schema.arguments)


class _BelowAutograd:
    """with _BelowAutograd(torch): dispatch below the Autograd keys. torch
    2.x's guard is a context manager; 1.13's guards while it lives."""
    __slots__ = ("torch", "guard")

    def __init__(self, torch):
        self.torch = torch

    def __enter__(self):
        self.guard = self.torch._C._AutoDispatchBelowAutograd()
        if hasattr(self.guard, "__enter__"):
            self.guard.__enter__()

    def __exit__(self, *exc):
        guard, self.guard = self.guard, None
        if hasattr(guard, "__exit__"):
            guard.__exit__(*exc)
        del guard


def _below_autograd(torch, overload):
    """An Autograd-key kernel that runs the op below autograd: outputs that
    do not require grad (torch's way for non-differentiable ops)."""
    def kernel(*args, **kwargs):
        with _BelowAutograd(torch):
            return overload(*args, **kwargs)
    return kernel


def _refuse_grad(torch, overload, why):
    """An Autograd-key kernel for an op torch cannot register a formula for
    (it writes an input): an error when a gradient would be needed."""
    def kernel(*args, **kwargs):
        if torch.is_grad_enabled() and any(
                isinstance(a, torch.Tensor) and a.requires_grad
                for a in list(args) + list(kwargs.values())):
            raise RuntimeError(why)
        with _BelowAutograd(torch):
            return overload(*args, **kwargs)
    return kernel


def _register_autograd(torch, lib, namespace, op, backward_of):
    name = op.name
    qualname = "%s::%s" % (namespace, name)
    overload = _overload(torch, namespace, name)
    kind = op.declarations["gradient"]
    if kind == "not differentiable":
        lib.impl(name, _below_autograd(torch, overload), "Autograd")
        return
    backward, why = _no_derivative(qualname, backward_of)
    mutable = _is_mutable(torch, namespace, name)
    if mutable:
        why = "%s writes an input in place and cannot be differentiated" % qualname
        lib.impl(name, _refuse_grad(torch, overload, why), "Autograd")
        return
    if not hasattr(torch.library, "register_autograd"):
        plan = _Plan(torch, namespace, op) if kind == "derivative" else None
        lib.impl(name, _function_kernel(torch, overload, plan, backward), "Autograd")
        return
    if kind == "derivative":
        plan = _Plan(torch, namespace, op)
        backward = lambda ctx, *grads: plan.run(torch, ctx, grads)  # noqa: E731
        if _has_kwonly(torch, namespace, name):
            def setup_context(ctx, inputs, keyword_only_inputs, output):
                plan.save(ctx, inputs, keyword_only_inputs, output)
        else:
            def setup_context(ctx, inputs, output):
                plan.save(ctx, inputs, {}, output)
        torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=lib)
    else:
        torch.library.register_autograd(qualname, backward, lib=lib)


def _function_kernel(torch, overload, plan, no_derivative):
    """torch without register_autograd (1.13): the derivative (plan, or
    no_derivative's error) through an autograd.Function at the Autograd
    key."""
    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            with _BelowAutograd(torch):
                out = overload(*args)
            if plan is not None:
                plan.save(ctx, args, {}, out)
            return out

        @staticmethod
        def backward(ctx, *grads):
            if plan is None:
                return no_derivative(ctx, *grads)
            return plan.run(torch, ctx, grads)

    def kernel(*args):
        return Fn.apply(*args)
    return kernel


# ---- registration --------------------------------------------------------------------

def _is_new(namespace, op):
    """Whether op is to be defined in namespace: False when this very op
    is; opjit.Error when another op holds the name."""
    known = _registered.get((namespace, op.name))
    if known is None:
        return True
    if known.schema != op.schema:
        raise Error("%s::%s is registered with torch as %r; torch cannot redefine it as %r"
                    % (namespace, op.name, known.schema, op.schema))
    if known != op:
        raise Error("%s::%s is registered with torch for another opjit op (from %s); "
                    "it cannot call this one (from %s) under that name: register it "
                    "under another namespace (register_torch(op, namespace=...))"
                    % (namespace, op.name, _where(known), _where(op)))
    return False


def _implement(torch, lib, namespace, op, fake, backward_of):
    """op's kernels, fake kernel and autograd, once every op of its family
    is defined (torch 1.13 keeps the overloads a packet saw first)."""
    for device, dispatch_key in (("cpu", "CPU"), ("cuda", "CUDA")):
        if device in op.devices:
            lib.impl(op.name, op, dispatch_key)
    modern = hasattr(torch.library, "register_fake") or hasattr(torch.library, "impl_abstract")
    if fake is None and op.declarations["shape_rule"]:
        fake = _make_fake(torch, op, modern)
    if fake is not None:
        _register_fake(torch, lib, namespace, op.name, fake)
    _register_autograd(torch, lib, namespace, op, backward_of)


def _where(op):
    src = op.sources
    return ", ".join(sorted(set(src.values()))) or "no source"


def register(op, namespace, runtime, fake):
    import torch
    _check_namespace(namespace)
    if not isinstance(op, Op):
        from . import default_runtime
        op = (runtime or default_runtime()).load_op(op)
    with _lock:
        lib = _library(torch, namespace)
        new = [(o, of) for o, of in _family(op) if _is_new(namespace, o)]
        for o, _ in new:  # every schema first, then what refers to them
            lib.define(o.schema)
            _registered[(namespace, o.name)] = o
        for o, of in new:
            _implement(torch, lib, namespace, o, fake if o == op else None, of)
    return getattr(getattr(torch.ops, namespace), _split(op.name)[0])
