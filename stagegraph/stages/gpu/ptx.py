"""PTX from LLVM IR (llvmlite's NVPTX backend) and its check by ptxas.

The MLIR bindings' LLVM has no NVPTX backend (``gpu-module-to-binary`` fails), so each
kernel module is translated to LLVM IR in MLIR and compiled here with llvmlite's LLVM,
which has one. Calls to libdevice (``__nv_expf``, ...) are resolved by linking the
``libdevice.10.bc`` of the ``nvidia-cuda-nvcc``/``nvidia-nvvm`` wheels, then everything but
the kernels is internalized so the optimizer drops what is unused.

ptxas (same wheels) assembles PTX without a GPU: the CI check that every kernel is valid
for its architecture, and its ``-v`` report gives registers, spills and shared memory.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from stagegraph.errors import PtxError

TRIPLE = "nvptx64-nvidia-cuda"
#: PTX ISA 8.0: the first with sm_90a (CUDA 12.0 drivers and later load it).
PTX_FEATURES = "+ptx80"


def _nvidia_roots() -> list[Path]:
    try:
        import nvidia  # the namespace package of NVIDIA's wheels
    except ImportError:
        return []
    return [Path(p) for p in nvidia.__path__]


@cache
def ptxas_path() -> Path | None:
    """ptxas from the ``nvidia-cuda-nvcc`` wheel (None when it is not installed)."""
    for root in _nvidia_roots():
        for found in sorted(root.glob("*/bin/ptxas")):
            return found
    return None


@cache
def libdevice_path() -> Path | None:
    """``libdevice.10.bc`` from the NVIDIA wheels (None when not installed)."""
    for root in _nvidia_roots():
        for found in sorted(root.glob("*/nvvm/libdevice/libdevice*.bc")):
            return found
    return None


@cache
def _llvm():
    try:
        import llvmlite.binding as llvm
    except ImportError as error:
        raise PtxError(
            "emitting PTX needs llvmlite (pip install 'stagegraph[gpu]'): " + str(error)
        ) from None
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm


_FP_TYPE = re.compile(r"\b(float|double|half|bfloat)\b")
_FP_LITERAL = re.compile(
    r"(?<![\w%@.$-])(f0x[0-9A-Fa-f]+|[-+]?(?:inf|[qs]?nan)\b|[-+]?\d+\.\d+(?:e[-+]?\d+)?)"
)


def _bits_hex(kind: str, value: float) -> str:
    """The literal every LLVM reads for ``value`` of FP type ``kind``: doubles and floats as
    the 64-bit pattern of the (float-rounded) value, halves ``0xH``, bfloats ``0xR``."""
    import numpy as np

    if kind == "half":
        return f"0xH{int(np.float16(value).view(np.uint16)):04X}"
    if kind == "bfloat":
        bits = int(np.float32(value).view(np.uint32))
        bits += 0x7FFF + ((bits >> 16) & 1)  # round to nearest even
        return f"0xR{(bits >> 16) & 0xFFFF:04X}"
    if kind == "float":
        value = float(np.float32(value))
    return f"0x{int(np.float64(value).view(np.uint64)):016X}"


def _literal(kind: str, token: str) -> str:
    import numpy as np

    if token.startswith("f0x"):  # the exact bits of the type (LLVM 23 syntax)
        digits = token[3:]
        if kind in ("half", "bfloat"):
            return f"0x{'H' if kind == 'half' else 'R'}{digits.upper()}"
        if len(digits) == 8:
            return _bits_hex("double", float(np.uint32(int(digits, 16)).view(np.float32)))
        return f"0x{digits.upper()}"
    return _bits_hex(kind, float(token.replace("qnan", "nan").replace("snan", "nan")))


def portable_llvm_ir(text: str) -> str:
    """The LLVM IR text with every floating-point literal in the hex forms every LLVM reads.

    The bindings' LLVM prints ``float 3.140000e+00`` (inexact in f32), ``f0x3C23D70A``
    (exact bits, a newer syntax) and ``float -inf``, which llvmlite's older parser rejects.
    A literal's type is the nearest FP type named before it on its line (LLVM writes the
    type before the operands of an instruction or a ``splat``). A change of spelling only.
    """
    lines = []
    for line in text.splitlines():
        if line.lstrip().startswith((";", "!", "source_filename", "target ")):
            lines.append(line)
            continue
        out, last = [], 0
        for match in _FP_LITERAL.finditer(line):
            types = _FP_TYPE.findall(line, 0, match.start())
            if not types:
                continue
            out += [line[last : match.start()], _literal(types[-1], match.group(1))]
            last = match.end()
        lines.append("".join(out) + line[last:])
    return "\n".join(lines) + "\n"


def llvm_ir_to_ptx(llvm_ir: str, arch: str, kernels: list[str]) -> str:
    """PTX for the LLVM IR of one kernel module, built for ``arch`` (``sm_90a``).

    ``kernels`` are the entry names kept visible; every other definition (libdevice's
    included) becomes internal, so it is inlined or dropped.

    Raises:
        PtxError: the IR does not parse or verify, or libdevice is needed but missing.
    """
    llvm = _llvm()
    try:
        module = llvm.parse_assembly(portable_llvm_ir(llvm_ir))
        module.triple = TRIPLE
        machine = llvm.Target.from_triple(TRIPLE).create_target_machine(
            cpu=arch, features=PTX_FEATURES, opt=3
        )
        module.data_layout = str(machine.target_data)
        if any(f.is_declaration and f.name.startswith("__nv_") for f in module.functions):
            module.link_in(_libdevice(llvm, machine))
        for function in module.functions:
            if not function.is_declaration and function.name not in kernels:
                function.linkage = llvm.Linkage.internal
        module.verify()
        tuning = llvm.create_pipeline_tuning_options(speed_level=3)
        builder = llvm.create_pass_builder(machine, tuning)
        builder.getModulePassManager().run(module, builder)
        return machine.emit_assembly(module)
    except RuntimeError as error:
        raise PtxError(f"LLVM could not build PTX for {arch}: {error}") from None


def _libdevice(llvm, machine):
    path = libdevice_path()
    if path is None:
        raise PtxError(
            "the kernel calls libdevice math functions, but no libdevice.10.bc was found "
            "(install nvidia-cuda-nvcc or nvidia-nvvm)"
        )
    library = llvm.parse_bitcode(path.read_bytes())
    library.triple = TRIPLE
    library.data_layout = str(machine.target_data)
    return library


@dataclass(frozen=True)
class PtxasReport:
    """What ``ptxas -v`` said of one kernel."""

    kernel: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    shared_bytes: int


_FUNCTION = re.compile(r"Compiling entry function '([^']+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_report(text: str) -> list[PtxasReport]:
    """The per-kernel resource lines of ``ptxas -v`` output (its stderr)."""
    reports: list[PtxasReport] = []
    parts = _FUNCTION.split(text)
    for name, body in zip(parts[1::2], parts[2::2], strict=False):
        frame = _FRAME.search(body)
        used = _USED.search(body)
        smem = _SMEM.search(body)
        reports.append(
            PtxasReport(
                kernel=name,
                registers=int(used.group(1)) if used else 0,
                spill_stores=int(frame.group(2)) if frame else 0,
                spill_loads=int(frame.group(3)) if frame else 0,
                stack_bytes=int(frame.group(1)) if frame else 0,
                shared_bytes=int(smem.group(1)) if smem else 0,
            )
        )
    return reports


def assemble(ptx: str, arch: str, timeout_s: float = 120.0) -> list[PtxasReport]:
    """Assemble ``ptx`` for ``arch`` with ptxas and return its resource report per kernel.

    Raises:
        PtxError: no ptxas installed, or ptxas rejected the PTX (its message included).
    """
    ptxas = ptxas_path()
    if ptxas is None:
        raise PtxError("no ptxas found: install nvidia-cuda-nvcc (the gpu extra)")
    with tempfile.TemporaryDirectory(prefix="stagegraph-ptxas-") as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        done = subprocess.run(
            [str(ptxas), f"-arch={arch}", "-v", str(source), "-o", str(Path(folder) / "k.cubin")],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    if done.returncode != 0:
        raise PtxError(f"ptxas rejected the PTX for {arch}: {done.stderr.strip()[-2000:]}")
    return parse_ptxas_report(done.stderr + done.stdout)
