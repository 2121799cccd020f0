"""Faster IR inlining of this package's ``inline="always"`` helpers, same IR.

Numba inlines an ``inline="always"`` function by deep-copying the callee's IR block by
block (``InlineWorker.inline_ir``, twice per call site). Each block's copy starts a
new ``copy.deepcopy`` memo, so each copies the callee's whole scope, every variable
of the function, again: the cost is blocks x variables. For a row kernel whose
helpers are themselves inlined that is 132 blocks x 1569 variables, and the copies
were most of the inlining pass (about 1.5 s of a 5 s compile; see "Compile time" in
docs/design.md).

Here the blocks of one copy share one memo per source scope, so the scope and its
variables are copied once: the copied IR has one scope object where Numba's had one
equal copy per block (Numba then takes the one scope by equality anyway), and the
same instructions, names and types, so the same machine code. Only calls whose
caller is a function of this package take the shared memo; any other compile in the
process runs Numba's code unchanged. This patches Numba internals: when the names it
relies on are missing, nothing is patched and compiles are only slower.
"""

import copy

_PACKAGE = __name__.split(".")[0]


class _SharedScopeCopy:
    """Stands in for the ``copy`` module inside one ``inline_ir`` call: a deepcopy of
    a block reuses the memo of earlier blocks with the same scope (kept alive here,
    so an ``id`` is never reused while its memo lives)."""

    def __init__(self, block_type):
        self._block_type = block_type
        self._memos = {}
        self._made = set()  # ids of the scopes of the copies made (alive in the memos)

    def deepcopy(self, value, memo=None):
        if memo is None and isinstance(value, self._block_type):
            scope = value.scope
            if id(scope) in self._made:
                # ``inline_ir`` copies its copy again, "an unmutated copy of the callee
                # to return", which both of Numba's callers (InlineInlinables and
                # InlineOverloads) drop: it is returned uncopied (half the copying)
                return value
            entry = self._memos.get(id(scope))
            if entry is None:
                entry = self._memos[id(scope)] = (scope, {})
            block = copy.deepcopy(value, entry[1])
            self._made.add(id(block.scope))
            return block
        return copy.deepcopy(value, memo)

    def __getattr__(self, name):
        return getattr(copy, name)


def _install():
    try:
        from numba.core import inline_closurecall, ir
    except ImportError:  # pragma: no cover
        return
    worker = getattr(inline_closurecall, "InlineWorker", None)
    original = getattr(worker, "inline_ir", None)
    if (original is None or getattr(original, "_normkernels", False)
            or getattr(inline_closurecall, "copy", None) is not copy
            or not hasattr(ir, "Block")):
        return

    def inline_ir(self, caller_ir, block, i, callee_ir, callee_freevars, arg_typs=None):
        func_id = getattr(caller_ir, "func_id", None)
        module = getattr(func_id, "modname", "") or ""
        if module.split(".")[0] != _PACKAGE:
            return original(self, caller_ir, block, i, callee_ir, callee_freevars,
                            arg_typs=arg_typs)
        # Numba compiles under one global lock, so no other inline_ir runs meanwhile
        inline_closurecall.copy = _SharedScopeCopy(ir.Block)
        try:
            return original(self, caller_ir, block, i, callee_ir, callee_freevars,
                            arg_typs=arg_typs)
        finally:
            inline_closurecall.copy = copy

    inline_ir._normkernels = True
    inline_ir.__wrapped__ = original
    inline_ir.__doc__ = original.__doc__
    worker.inline_ir = inline_ir

    inline_function = getattr(worker, "inline_function", None)
    if inline_function is not None and hasattr(worker, "run_untyped_passes"):
        worker.inline_function = _memo_untyped(inline_function)
    _type_inlined_overloads_only()


def _type_inlined_overloads_only():
    """Typing a call of an ``inline="always"`` ``@overload`` runs type inference on
    the implementation's IR, whose typed IR is then inlined; before that it asks the
    implementation's dispatcher for a call template, which compiles it whole (lowering
    and LLVM included, 0.03-0.15 s a signature) for a result nobody uses (Numba PR
    #6856). For this package's overloads the dispatcher is told not to compile:
    the template it returns is not used."""
    try:
        from numba.core.typing.templates import _OverloadFunctionTemplate
    except ImportError:  # pragma: no cover
        return
    original = getattr(_OverloadFunctionTemplate, "_get_jit_decorator", None)
    if original is None or getattr(original, "_normkernels", False):
        return

    def _get_jit_decorator(self):
        jitter = original(self)
        inline = getattr(self, "_inline", None)
        module = getattr(getattr(self, "_overload_func", None), "__module__", "") or ""
        if (inline is None or not inline.is_always_inline
                or module.split(".")[0] != _PACKAGE):
            return jitter

        def typing_only(*args, **kwargs):
            decorate = jitter(*args, **kwargs)

            def make(function):
                dispatcher = decorate(function)
                dispatcher._can_compile = False
                return dispatcher
            return make
        return typing_only

    _get_jit_decorator._normkernels = True
    _get_jit_decorator.__wrapped__ = original
    _OverloadFunctionTemplate._get_jit_decorator = _get_jit_decorator


_UNTYPED = {}  # (function, the flags' values) -> its untyped IR


def _memo_untyped(original):
    """``InlineWorker.inline_function`` for this package's helpers: the callee's
    untyped IR (bytecode analysis and the untyped pipeline, its own inlining of its
    helpers included) built once per process and flags, not at every call site;
    ``inline_ir`` copies it before changing anything."""

    def inline_function(self, caller_ir, block, i, function, arg_typs=None):
        module = getattr(function, "__module__", "") or ""
        if module.split(".")[0] != _PACKAGE:
            return original(self, caller_ir, block, i, function, arg_typs=arg_typs)
        key = (function, str(self.flags))
        callee_ir = _UNTYPED.get(key)
        if callee_ir is None:
            callee_ir = _UNTYPED[key] = self.run_untyped_passes(function)
        else:
            self.flags.enable_ssa = False  # as run_untyped_passes leaves the flags
        return self.inline_ir(caller_ir, block, i, callee_ir, function.__code__.co_freevars,
                              arg_typs=arg_typs)

    inline_function._normkernels = True
    inline_function.__wrapped__ = original
    return inline_function


def _reset_labels():
    """Numba's global IR label counter (``ir_utils._the_max_label``) about doubles at
    each inlining of an ``inline="always"`` overload: the callee's labels, already as
    large as the counter was when its IR was built, are offset by the counter's value.
    One kernel compile adds about six decimal digits; after some tens of compiles in one
    process the block names outgrow LLVM's name-length limit ("name is too long"). No
    label needs to stay above the labels of a compile that has ended (every user of the
    counter first raises it above the labels of the function it rewrites), so a
    top-level compile starts it from 0, as the process's first compile does."""
    try:
        from numba.core import ir_utils
        ir_utils._the_max_label._value = 0
    except (ImportError, AttributeError):  # pragma: no cover
        pass


def _install_at_first_compile():
    """Patch when Numba first compiles, not at import: importing Numba's inliner
    costs 50 ms, which a process that only loads cached kernels never needs. The
    listener also resets the label counter at each top-level compile (the event fires
    under Numba's global compiler lock; nested compiles, of callees during typing,
    only count the depth)."""
    try:
        from numba.core import event
        listener_base = event.Listener
    except (ImportError, AttributeError):  # pragma: no cover
        _install()
        return

    class _AtCompile(listener_base):
        def on_start(self, ev):
            if not self.installed:
                self.installed = True
                _install()
            if self.depth == 0:
                _reset_labels()
            self.depth += 1

        def on_end(self, ev):
            self.depth -= 1

    listener = _AtCompile()
    listener.installed = False
    listener.depth = 0
    event.register("numba:compile", listener)


_install_at_first_compile()
