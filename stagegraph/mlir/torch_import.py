"""torch-mlir's FX importer: a ``torch.export`` program to linalg-on-tensors MLIR text.

This is the one place that calls ``torch_mlir.fx`` (only :mod:`stagegraph.mlir` may import
the torch-mlir wheel). The program is decomposed with torch-mlir's own decomposition table
and imported frozen (parameters and buffers become constants, updated buffers extra
results first), the layout the KernelBench payloads in ``../shared/kernelbench`` have. The
result is returned as text: the bindings stagegraph parses with may be another copy of MLIR
than the importer's (:mod:`stagegraph.mlir.bindings` prefers the official ``mlir``
package), so the module crosses as its printed form, resources included.
"""

from __future__ import annotations

import warnings
from typing import Any

from stagegraph.errors import PayloadError


def import_program(program: Any, what: str) -> tuple[str, Any]:
    """The linalg-on-tensors module of an exported program as text, and the decomposed
    program's graph signature (see :func:`import_program_to`, which writes the text to a
    file instead of holding it)."""
    module, signature = _import(program, what)
    return str(module), signature


def import_program_to(program: Any, what: str, path: Any) -> Any:
    """Write the linalg-on-tensors module of an exported program into ``path``: as
    bytecode for a ``.mlirbc`` path (the weights as raw bytes: printing them in hex, twice
    their size, took VGG-16's import to 2.8 GB over the module itself, and parsing
    the hex back as much), else as text, printed straight into the file. Bytecode is for
    a reader of the same MLIR (the importer's bindings). Returns the graph signature of
    the decomposed program (see :func:`_import`)."""
    module, signature = _import(program, what)
    if str(path).endswith(".mlirbc") and _all_ops_registered(module):
        with open(path, "wb") as file:
            module.operation.write_bytecode(file)
    else:
        with open(path, "w") as file:
            module.operation.print(file=file)
    return signature


def _all_ops_registered(module: Any) -> bool:
    """Whether stagegraph's own parsing context registers every op of ``module``. A module
    with others (torch-mlir's ``tm_tensor.scan`` for a cumulative sum) is written as text
    even to a ``.mlirbc`` path (MLIR tells the formats apart by content): the payload
    parser rewrites those ops from the text's generic form
    (:func:`stagegraph.mlir.diagnostics.parse_payload`), which bytecode does not give it."""
    from stagegraph.mlir.bindings import new_context
    from stagegraph.mlir.walk import collect

    reader = new_context()
    names = {op.name for op in collect(module.operation)}
    return all(reader.is_registered_operation(name) for name in names)


def _import(program: Any, what: str) -> tuple[Any, Any]:
    """The linalg-on-tensors module (entry ``@main``) of an exported program, and
    the graph signature of the decomposed program (its ``output_specs`` say which results
    are updated buffers: a training-mode export shows them only after decomposition).

    ``program`` is a ``torch.export.ExportedProgram`` (decompositions are applied here);
    ``what`` names the model in messages (``l1_019_ReLU.py:Model``).

    Raises:
        PayloadError: the importer or torch-mlir's lowering cannot take an op; the message
            quotes torch-mlir's diagnostic, which names the op (``torch.aten.foo``).
    """
    from torch_mlir import fx, ir
    from torch_mlir.dialects import torch as torch_dialect
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table
    from torch_mlir.extras.fx_importer import FxImporter

    from stagegraph.mlir.diagnostics import capture_diagnostics
    from stagegraph.mlir.torch_import_memory import lean_import

    context = ir.Context()
    torch_dialect.register_dialect(context)
    with capture_diagnostics(context) as diagnostics:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                program = program.run_decompositions(get_decomposition_table())
                _no_state_in_lists(program)
                with lean_import():  # without torch-mlir's copies of the weights
                    module = fx.export_and_import(
                        program,
                        output_type="linalg-on-tensors",
                        decomposition_table={},
                        fx_importer=FxImporter(context=context),
                    )
        except Exception as exc:  # torch-mlir raises plain Python errors of many kinds
            reason = "; ".join(diagnostics[:3]) if diagnostics else _reason(exc)
            raise PayloadError(
                f"{what}: torch-mlir's FX importer cannot lower it to linalg on tensors: {reason}"
            ) from None
    return module, program.graph_signature


def _no_state_in_lists(program: Any) -> None:
    """Give each parameter or buffer that an op takes inside a list (``cat((x, self.h))``)
    its own ``aten.clone`` node in that list. The frozen import replaces state placeholders
    with their tensors, and its list import takes a bare tensor for a heterogeneous list."""
    import torch
    from torch.fx import Node

    signature = program.graph_signature
    state = {*signature.inputs_to_parameters, *signature.inputs_to_buffers,
             *getattr(signature, "inputs_to_lifted_tensor_constants", {})}  # fmt: skip
    graph = program.graph

    def is_state(item: Any) -> bool:
        return isinstance(item, Node) and item.op == "placeholder" and item.name in state

    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        args = list(node.args)
        for position, arg in enumerate(args):
            if not (isinstance(arg, list | tuple) and any(map(is_state, arg))):
                continue
            items = []
            for item in arg:
                if is_state(item):
                    with graph.inserting_before(node):
                        copy = graph.call_function(torch.ops.aten.clone.default, (item,))
                    copy.meta = dict(item.meta)
                    item = copy
                items.append(item)
            args[position] = type(arg)(items)
        node.args = tuple(args)


def _reason(exc: BaseException) -> str:
    """The diagnostic part of an importer error: its first lines, without the pipeline
    reproducer torch-mlir appends (hundreds of lines of pass names)."""
    lines = [line.rstrip() for line in str(exc).strip().splitlines() if line.strip()]
    kept = [
        line for line in lines if "error:" in line or "note:" in line or "failed" in line.lower()
    ] or lines[:3]
    text = "; ".join(kept[:4]) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"
