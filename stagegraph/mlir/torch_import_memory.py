"""torch-mlir's FX importer without its copies of the weights.

**Weights as arrays, not Python lists.** torch-mlir's FX importer makes each frozen
parameter's ``dense_resource`` literal from ``np.array(tensor.tolist())``: every element
becomes a Python float, then a float64, then the tensor's type again. For VGG-16's 138 M
weights that took most of a minute and about 4 GB of memory at its peak (a float object
and a list slot per element), against 552 MB of weights. Its comment says why:
``Tensor.numpy()`` refuses while the importer runs under a ``FakeTensorMode``. That mode
can be set aside for the read (``unset_fake_temporarily``), and the tensor's own bytes
copied once. The importer's literal cache gets, for each parameter, the same attribute
(same bytes, type and blob name) before its literal op is made, so the importer's own
function finds it there and makes the op as always. Tensors not covered (bfloat16, which
numpy has no type for; one element, which the importer makes a splat) take the
importer's own path.

**Pipelines without a printed copy.** Before each of its two lowering pipelines, torch-mlir
prints the whole module into a string, for a reproducer should the pipeline fail
(``run_pipeline_with_repro_report``): its resources in hex, twice the weights' size, plus
the printer's own buffer (VGG-16: 2.1 GB more at the import's peak). The importer here runs
the same pipelines without that string; a failure still raises with the pipeline's
diagnostics, which :mod:`stagegraph.mlir.torch_import` captures and reports.

:func:`lean_import` applies both while the importer runs, and restores torch-mlir after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def _resource_literal(importer: Any, tensor: Any) -> Any | None:
    """The ``dense_resource`` attribute the importer would make for ``tensor``, from its
    bytes; None where the importer's own path is kept."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    npy_dtype = importer.TORCH_DTYPE_TO_NPY_TYPE.get(tensor.dtype)
    if npy_dtype is None or tensor.dtype == torch.bfloat16 or tensor.numel() <= 1:
        return None
    with unset_fake_temporarily():
        array = tensor.detach().cpu().contiguous().numpy().astype(npy_dtype, copy=True)
    shape = "_".join(str(d) for d in tensor.shape)
    return importer.DenseResourceElementsAttr.get_from_buffer(
        array, f"torch_tensor_{shape}_{tensor.dtype}", importer.create_mlir_tensor_type(tensor)
    )


def _make_literal(original: Any, importer: Any) -> Any:
    """The importer's literal maker, with the parameter's attribute made from its bytes
    first (:func:`_resource_literal`)."""

    def make_literal(tensor: Any, vtensor_type: Any, py_attr_tracker: Any) -> Any:
        mapping = py_attr_tracker.track(tensor)
        if mapping.is_empty:
            attr = _resource_literal(importer, tensor)
            if attr is not None:
                mapping.value = attr
        return original(tensor, vtensor_type, py_attr_tracker)

    return make_literal


def _run_pipeline(
    module: Any, pipeline: str, description: str, enable_ir_printing: bool = False
) -> None:
    """torch-mlir's ``run_pipeline_with_repro_report`` without the printed module."""
    from torch_mlir.passmanager import PassManager

    with module.context as context:
        context.emit_error_diagnostics = True  # torch-mlir's: errors fail the pipeline
        PassManager.parse(pipeline).run(module.operation)


@contextlib.contextmanager
def lean_import() -> Iterator[None]:
    """While the block runs, the FX importer reads parameters as arrays and runs its
    pipelines without printing the module (see the module's docstring); torch-mlir's own
    functions are back afterwards."""
    from torch_mlir import compiler_utils, fx
    from torch_mlir.extras import fx_importer

    patches = [
        (fx_importer, "_make_vtensor_literal_op",
         _make_literal(fx_importer._make_vtensor_literal_op, fx_importer)),
        (fx, "run_pipeline_with_repro_report", _run_pipeline),
        (compiler_utils, "run_pipeline_with_repro_report", _run_pipeline),
    ]  # fmt: skip
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    try:
        for module, name, replacement in patches:
            setattr(module, name, replacement)
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


__all__ = ["lean_import"]
