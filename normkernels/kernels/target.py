"""What the JIT target can do, asked of LLVM itself.

The kernels are compiled for Numba's target: the host CPU, or the one that
``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` name. A 16-bit conversion or a streaming
store is emitted only where that target has an instruction for it; elsewhere LLVM
would lower it to a compiler-rt call (``__truncsfbf2``, ``__truncsfhf2``,
``__extendhfsf2``) that Numba's JIT cannot link, and the process aborts.

The decision is made from what LLVM emits, not from a CPU name or a feature table
kept here: a few one-line functions are compiled for the JIT's (triple, CPU,
features), the same triple Numba keys its disk cache on, and their assembly is
read. That covers every spelling of a target: the host's feature list (a cloud VM
may report ``znver4`` while hiding AVX-512), a CPU name with the features cleared
(LLVM then uses the name's own features), an explicit feature list, aarch64.

The probe runs once per process, when the first kernel that needs it is compiled
(about 10 ms), never at import.
"""

import functools
import re
from dataclasses import dataclass

# Each capability: a one-line function and the instructions in its assembly that show
# the target does it inline (x86, aarch64). A compiler-rt symbol ("__...") in it means
# the target lacks the instruction.
_PROBES = {
    "f16_narrow": ("<16 x i16> (<16 x float> %x)",
                   "%h = fptrunc <16 x float> %x to <16 x half>\n"
                   "%r = bitcast <16 x half> %h to <16 x i16>", ("vcvtps2ph", "fcvt")),
    "f16_widen": ("<16 x float> (<16 x i16> %x)",
                  "%h = bitcast <16 x i16> %x to <16 x half>\n"
                  "%r = fpext <16 x half> %h to <16 x float>", ("vcvtph2ps", "fcvt")),
    "avx512bf16": ("<16 x i16> (<16 x float> %x)",
                   "%h = fptrunc <16 x float> %x to <16 x bfloat>\n"
                   "%r = bitcast <16 x bfloat> %h to <16 x i16>", ("vcvtneps2bf16",)),
    "avx512dq": ("<8 x i64> (<8 x double> %x)", "%r = fptosi <8 x double> %x to <8 x i64>",
                 ("vcvttpd2qq",)),
    "avx512f": ("<16 x float> (<16 x float> %x) #0", "%r = fadd <16 x float> %x, %x",
                ("zmm",)),
    "fma": ("<16 x float> (<16 x float> %x)",
            "%r = call <16 x float> @llvm.fma.v16f32(<16 x float> %x, <16 x float> %x, "
            "<16 x float> %x)", ("vfmadd", "fmla")),
    "avx2": ("<8 x i32> (<8 x i32> %x)", "%r = add <8 x i32> %x, %x", ("vpaddd\t%ymm",)),
    "avx": ("<8 x float> (<8 x float> %x)", "%r = fadd <8 x float> %x, %x", ("ymm",)),
}
_PROBE_ATTRIBUTES = ('attributes #0 = { "min-legal-vector-width"="512" }\n'
                     "declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, "
                     "<16 x float>)")


@dataclass(frozen=True)
class Target:
    """The JIT target and what the kernels use of it."""

    triple: str
    cpu: str
    features: str  # as given to LLVM ("" = the CPU name's own)
    found: frozenset  # the names of _PROBES whose instructions LLVM emitted inline

    @property
    def x86(self):
        return self.triple.startswith(("x86_64", "amd64"))

    @property
    def f16_native(self):
        """float16 <-> float32 by LLVM's ``half`` conversions (F16C, aarch64 fcvt)."""
        return {"f16_narrow", "f16_widen"} <= self.found

    @property
    def bf16_native(self):
        """float32 -> bfloat16 by ``vcvtneps2bf16`` (AVX512-BF16) in vector bodies."""
        return self.x86 and "avx512bf16" in self.found

    @property
    def avx512dq(self):
        """``vfpclassps`` for the subnormal test beside ``vcvtneps2bf16``."""
        return self.x86 and "avx512dq" in self.found

    @property
    def fma(self):
        """A fused multiply-add instruction (x86 FMA3, aarch64 ``fmla``): float32 rows
        are then normalized in float32 lanes (without it ``llvm.fma`` is a libm call
        per element, and they keep float64 lanes: other bits, docs/design.md)."""
        return "fma" in self.found

    @property
    def avx(self):
        """x86 with 32-byte vectors: the streaming stores' pieces."""
        return self.x86 and "avx" in self.found

    def features_shown(self):
        """The features that matter here, as LLVM showed them for this target."""
        names = {"avx2": "avx2", "fma": "fma", "avx512f": "avx512f", "avx512dq": "avx512dq",
                 "avx512bf16": "avx512bf16"}
        shown = [v for k, v in names.items() if self.x86 and k in self.found]
        if self.f16_native:
            shown.insert(1 if shown[:1] == ["avx2"] else 0, "f16c" if self.x86 else "fp16 fcvt")
        return shown

    def conversions(self):
        """{dtype name: how its kernels narrow and widen}."""
        f16 = ("F16C vcvtps2ph / vcvtph2ps" if self.x86 else "fcvt") if self.f16_native \
            else "integer bits (round to nearest even) / integer bits"
        bf16 = ("AVX512-BF16 vcvtneps2bf16 in vector bodies, integer bits for scalars and "
                "subnormal lanes / shift" if self.bf16_native
                else "integer bits (round to nearest even) / shift")
        return {"float16": f16, "bfloat16": bf16}


def _functions(asm):
    """{function name: its assembly} from LLVM's output."""
    bodies = {}
    for name, body in re.findall(r"^([A-Za-z_][\w.]*):\s*(?:#|//|;)?[^\n]*\n(.*?)"
                                 r"(?=^\.Lfunc_end|^\s*\.size|\Z)", asm, re.M | re.S):
        bodies.setdefault(name, body)
    return bodies


def _inline(body, mnemonics):
    """True when ``body`` uses one of ``mnemonics`` and names no compiler-rt symbol
    (``__truncsfhf2`` and the like: the target lacks the instruction)."""
    return "__" not in body and any(m in body for m in mnemonics)


def probe(triple, cpu, features):
    """A :class:`Target` for LLVM target (``triple``, ``cpu``, ``features``)."""
    from llvmlite import binding

    binding.initialize_native_target()  # idempotent; Numba does it too
    binding.initialize_native_asmprinter()
    machine = binding.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=features, opt=2)
    functions = [f"define {sig.replace('(', f'@{name}(', 1)} {{\n{body}\nret "
                 f"{sig.split(' (')[0]} %r\n}}" for name, (sig, body, _) in _PROBES.items()]
    module = binding.parse_assembly(
        f'target triple = "{triple}"\n' + "\n".join(functions) + "\n" + _PROBE_ATTRIBUTES)
    module.verify()
    bodies = _functions(machine.emit_assembly(module))
    found = frozenset(name for name, (_, _, shows) in _PROBES.items()
                      if _inline(bodies.get(name, ""), shows))
    return Target(triple=triple, cpu=cpu, features=features, found=found)


@functools.cache
def jit_target():
    """The :class:`Target` Numba's JIT compiles for in this process (its cache key)."""
    from numba.core.registry import cpu_target

    return probe(*cpu_target.target_context.codegen().magic_tuple())
