"""The importer's weights read as arrays, not as Python lists.

torch-mlir's FX importer makes each frozen parameter's ``dense_resource`` literal from
``np.array(tensor.tolist())``: every element becomes a Python float, then a float64, then
the tensor's type again. For VGG-16's 138 M weights that took most of a minute and about
4 GB of memory at its peak (a float object and a list slot per element), against 552 MB
of weights. Its comment says why: ``Tensor.numpy()`` refuses while the importer runs under
a ``FakeTensorMode``. That mode can be set aside for the read
(``unset_fake_temporarily``), and the tensor's own bytes copied once.

:func:`weights_as_arrays` fills the importer's literal cache for each parameter with the
same attribute (same bytes, type and blob name) before its literal op is made, so the
importer's own function finds it there and makes the op as always. Tensors it does not
cover (bfloat16, which numpy has no type for; one element, which the importer makes a
splat) take the importer's own path.
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


@contextlib.contextmanager
def weights_as_arrays() -> Iterator[None]:
    """While the block runs, the FX importer reads parameters as arrays (see the module's
    docstring); its own function is back afterwards."""
    from torch_mlir.extras import fx_importer

    original = fx_importer._make_vtensor_literal_op

    def make_literal(tensor: Any, vtensor_type: Any, py_attr_tracker: Any) -> Any:
        mapping = py_attr_tracker.track(tensor)
        if mapping.is_empty:
            attr = _resource_literal(fx_importer, tensor)
            if attr is not None:
                mapping.value = attr
        return original(tensor, vtensor_type, py_attr_tracker)

    fx_importer._make_vtensor_literal_op = make_literal
    try:
        yield
    finally:
        fx_importer._make_vtensor_literal_op = original


__all__ = ["weights_as_arrays"]
