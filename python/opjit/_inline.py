"""opjit.load_inline: ops from a string, and the signature of an op.

    import opjit, numpy as np
    m = opjit.load_inline("scale2", '''
    #include <opjit_op.h>
    static int scale2_cpu(opjit_ctx *ctx, opjit_args *a) { ... }
    OPJIT_MODULE(m) { opjit_def(m, "scale2(Tensor x) -> Tensor", OPJIT_CPU, scale2_cpu, "x * 2"); }
    ''')
    m.scale2(np.ones(3, np.float32))
"""
import os as _os

from . import _opjit


class InlineModule:
    """The ops of a module loaded from a string: one attribute per op
    (m.scale2), iterable in load order; m["scale2"] works too. An op named
    like a method (e.g. "keys") is still an attribute: ops come first."""

    def __init__(self, name, ops):
        object.__setattr__(self, "_InlineModule__name", name)
        object.__setattr__(self, "_InlineModule__ops", tuple(ops))
        for op in ops:
            object.__setattr__(self, op.name, op)

    def __iter__(self):
        return iter(self.__ops)

    def __len__(self):
        return len(self.__ops)

    def __getitem__(self, name):
        for op in self.__ops:
            if op.name == name:
                return op
        raise KeyError(name)

    def __dir__(self):
        return sorted(set(object.__dir__(self)) | {op.name for op in self.__ops})

    def __setattr__(self, name, value):
        raise AttributeError("the ops of an InlineModule are fixed; load_inline again to "
                             "change them")

    def __repr__(self):
        return "<opjit inline module %s: %s>" % (
            self.__name, ", ".join(op.name for op in self.__ops))


def _file_name(name, cuda):
    if not isinstance(name, str):
        raise TypeError("load_inline: name must be a str, not %s" % type(name).__name__)
    if name.endswith(".cu") or name.endswith(".c"):
        if cuda is not None and cuda != name.endswith(".cu"):
            raise ValueError("load_inline: %r and cuda=%r disagree" % (name, cuda))
        return name
    return name + (".cu" if cuda else ".c")


def load_inline(name, source, *, include_dir=None, cuda=None, runtime=None):
    """Load a module of ops from source text: returns an InlineModule whose
    attributes are the ops it registers (one call for all of them).

    name: the module's name ("scale2"), which diagnostics use
    ("scale2.c:3: error: ..."); "scale2.c" or "scale2.cu" say the language,
    as does cuda=True (a .cu: device code for NVRTC under
    #ifdef __CUDACC_RTC__, the host launcher in C). source: the text (str).
    include_dir: the directory its #include "x.h" headers come from (they
    must resolve inside it); None: no local headers (#include <...> still
    finds opjit_op.h and system headers). runtime: an opjit.Runtime, by
    default the default runtime.

    The text is cached by content like a file: the same name and text (and
    headers) is a cache hit in any later process. Loading the same name
    again with another text replaces the module. Raises CompileError with
    the compiler's diagnostics, Error for a refused include or name."""
    if not isinstance(source, str):
        raise TypeError("load_inline: source must be a str, not %s" % type(source).__name__)
    if runtime is None:
        from . import default_runtime
        runtime = default_runtime()
    if include_dir is not None:
        include_dir = _os.fspath(include_dir)
    file = _file_name(name, cuda)
    return InlineModule(file, _opjit._load_inline(runtime, file, source, include_dir))


def _default_value(text):
    import ast  # here: importing it costs more than the rest of opjit's import
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _signature(op):
    """inspect.Signature of op from its schema: names, defaults, and the
    schema's types as annotations ('Tensor', 'float', 'int[2]')."""
    import inspect
    params = []
    for name, type_, default in op._arguments:
        params.append(inspect.Parameter(
            name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=type_,
            default=inspect.Parameter.empty if default is None else _default_value(default)))
    returns = op.schema.rpartition("->")[2].strip()
    return inspect.Signature(params, return_annotation=returns or inspect.Signature.empty)


_opjit._set_signature_hook(_signature)
