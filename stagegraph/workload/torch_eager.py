"""The PyTorch side of a PyTorch workload: ``torch.export`` of the model (refusing random
draws it cannot verify), its eager run on the same inputs (outputs and updated buffers as the
``.npz`` arrays), and tensors as numpy arrays. Imports torch when called.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stagegraph.errors import PayloadError
from stagegraph.workload.torch_source import TorchProblem


def export(problem: TorchProblem) -> Any:
    """``torch.export`` of the model on its inputs (non-strict, static shapes).

    Raises:
        PayloadError: the model cannot be captured (data-dependent control flow, ...), or
            its forward draws random numbers (dropout in training mode is put in eval mode
            before; other draws cannot be verified).
    """
    import warnings

    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.export.export(problem.model, tuple(problem.inputs), strict=False)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise PayloadError(
            f"{problem.what}: torch.export cannot capture it: {type(exc).__name__}: {first}"
        ) from None
    random = sorted({str(n.target) for n in program.graph.nodes if _draws_random(n)})
    if random:
        raise PayloadError(
            f"{problem.what}: its forward draws random numbers ({', '.join(random)}); "
            f"compiled code cannot reproduce PyTorch's generator, so its results cannot be "
            f"checked against eager PyTorch (make the random tensors inputs or attributes)"
        )
    return program


def register_tensor_attributes(module: Any) -> None:
    """Make a module's plain tensor attributes (``self.hidden = torch.randn(...)``, neither
    parameter nor buffer) buffers: ``torch.export`` refuses a forward that
    reassigns such a constant, while an updated buffer becomes an extra, verified result."""
    import torch

    for name, value in list(vars(module).items()):
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
            delattr(module, name)
            module.register_buffer(name, value)  # persistent: the frozen import reads it


def updated_inputs(signature: Any) -> list[int | None]:
    """For each buffer-update result of an exported program (they come first), the index of
    the user input it updates, or None for a buffer of the model."""
    from torch.export.graph_signature import OutputKind

    user_inputs = [s.arg.name for s in signature.input_specs if s.kind.name == "USER_INPUT"]
    found: list[int | None] = []
    for spec in signature.output_specs:
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            found.append(user_inputs.index(spec.target))
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            found.append(None)
    return found


#: Recurrent ops tagged as seeded only for their dropout between layers (0 by default).
_RECURRENT = ("aten.lstm", "aten.gru", "aten.rnn_tanh", "aten.rnn_relu")


def _draws_random(node: Any) -> bool:
    """Whether an exported node draws random numbers: a seeded op, except recurrent ops,
    dropout whose ``train`` argument is false (a model in eval mode) and attention without
    dropout."""
    import torch

    name = str(node.target)
    if torch.Tag.nondeterministic_seeded not in getattr(node.target, "tags", ()):
        return False
    if "dropout" in name:
        return len(node.args) > 2 and node.args[2] is True
    if "scaled_dot_product" in name:  # attention's own dropout, 0 unless asked for
        return node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0) != 0
    return not name.startswith(_RECURRENT)


def eager_arrays(
    model: Any, problem: TorchProblem, signature: Any
) -> tuple[dict[str, np.ndarray], Any]:
    """``in*``, ``mut*`` and ``out*`` arrays: the inputs, then what eager PyTorch returns
    and the buffers (and inputs) it updates, in the order of the exported program's results;
    and the structure of the model's output (a pytree spec: tensor, tuple, ...).

    Raises:
        PayloadError: the eager run fails or returns a value that is no tensor.
    """
    import torch
    from torch.export.graph_signature import OutputKind
    from torch.utils._pytree import tree_flatten

    arrays = {f"in{i}": to_numpy(value) for i, value in enumerate(problem.inputs)
              if value is not None}  # fmt: skip
    args = [v.clone() if isinstance(v, torch.Tensor) else v for v in problem.inputs]
    try:
        with torch.no_grad():
            leaves, tree = tree_flatten(model(*args))
            outputs = iter(leaves)
    except Exception as exc:
        raise PayloadError(f"{problem.what}: the eager run failed: {type(exc).__name__}: {exc}"
                           ) from None  # fmt: skip
    user_inputs = [s.arg.name for s in signature.input_specs if s.kind.name == "USER_INPUT"]
    mutated = 0
    for index, spec in enumerate(signature.output_specs):
        if spec.kind == OutputKind.BUFFER_MUTATION:
            value = model.get_buffer(spec.target)
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            value = args[user_inputs.index(spec.target)]
        else:
            value = next(outputs, None)
            if not isinstance(value, torch.Tensor):
                raise PayloadError(f"{problem.what}: result #{index} is "
                                   f"{type(value).__name__}, not a tensor")  # fmt: skip
            arrays[f"out{index - mutated}"] = to_numpy(value)
            continue
        arrays[f"mut{mutated}"] = to_numpy(value)
        mutated += 1
    return arrays, tree


def to_numpy(value: Any) -> np.ndarray:
    """A tensor or Python scalar as a numpy array (scalars: 0-d f64/i64/bool, as the
    importer types them)."""
    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().contiguous()
        if value.dtype == torch.bfloat16:  # numpy has none: its bit patterns, as stagegraph
            return value.view(torch.uint16).numpy()  # stores bf16 (see stagegraph.dtypes)
        return value.numpy()
    if isinstance(value, bool):
        return np.array(value, np.bool_)
    if isinstance(value, int):
        return np.array(value, np.int64)
    if isinstance(value, float):
        return np.array(value, np.float64)
    raise PayloadError(f"an input of type {type(value).__name__} is no tensor or scalar")
