"""Compiled PyTorch models called from PyTorch: ``sg.compile`` and the ``torch.compile``
backend ``sg.torch_backend``.

A model and its example inputs are imported (:mod:`stagegraph.workload.torch_model`),
compiled through a graph for a target, and wrapped in a :class:`CompiledModel`: a callable
taking torch tensors (or numpy arrays, or Python scalars) and returning torch tensors in the
structure the model returns. Contiguous CPU tensors cross without a copy (``.numpy()``
views them) and outputs come back as ``torch.from_numpy`` views of the arrays the compiled
code wrote. The import is frozen: parameters and buffers are constants of the compiled
code, so a later change to the model's weights needs a new compile, and buffers a
training-mode model updates (BatchNorm's running statistics) are not written back. Inputs
the graph updates in place are: under ``torch.compile``, Dynamo passes a module's buffers
as inputs, so the backend keeps BatchNorm's running statistics current, as eager does.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from stagegraph.core.graph import Graph
from stagegraph.errors import SignatureError, StagegraphError, StagegraphWarning
from stagegraph.workload.torch_eager import to_numpy
from stagegraph.workload.torch_model import TorchWorkload, from_torch
from stagegraph.workload.torch_source import require_torch


class CompiledModel:
    """A model compiled by stagegraph, called like the model (see the module docstring).

    ``check=True`` runs the model eagerly beside the first call and raises
    :class:`~stagegraph.errors.VerificationError` when the results differ beyond the
    workload's tolerance.
    """

    def __init__(self, workload: TorchWorkload, binary: Any, check: bool = False) -> None:
        self.workload = workload
        self.binary = binary
        self.check = check
        self._specs = workload.input_specs()

    def __call__(self, *args: Any) -> Any:
        torch = require_torch("a compiled PyTorch model")
        from torch.utils._pytree import tree_unflatten

        results = self.binary.call(self.workload.entry, self._arrays(args))
        mutations = self.workload.mutations
        outputs = results[len(mutations) :]
        if self.check:
            self.check = False
            self._compare(args, outputs)
        for index, updated in zip(mutations, results, strict=False):
            if index is not None and isinstance(args[index], torch.Tensor):
                args[index].copy_(torch.from_numpy(updated))  # an input updated in place
        specs = self.workload.output_specs()[len(mutations) :]
        tensors = [_tensor(torch, r, s.dtype) for r, s in zip(outputs, specs, strict=True)]
        return tree_unflatten(tensors, self.workload.output_tree)

    def _arrays(self, args: Sequence[Any]) -> list[np.ndarray]:
        if len(args) != len(self._specs):
            raise SignatureError(
                f"{self.workload.spec}: compiled for {len(self._specs)} inputs, called with "
                f"{len(args)}"
            )
        arrays = []
        for i, (value, spec) in enumerate(zip(args, self._specs, strict=True)):
            array = value if isinstance(value, np.ndarray) else to_numpy(value)
            if array.shape != spec.shape or array.dtype != spec.numpy_dtype:
                raise SignatureError(
                    f"{self.workload.spec}: input #{i} is {array.dtype}{list(array.shape)}, "
                    f"but it was compiled for {spec.dtype}{list(spec.shape)}"
                )
            arrays.append(np.require(array, requirements="C"))  # (0-d stays 0-d)
        return arrays

    def _compare(self, args: Sequence[Any], results: list[np.ndarray]) -> None:
        """Eager PyTorch on the same inputs (a fresh copy of the model) against ``results``."""
        import torch
        from torch.utils._pytree import tree_leaves

        from stagegraph.errors import VerificationError

        inputs = [torch.from_numpy(np.array(a)) if isinstance(a, np.ndarray) else a for a in args]
        with torch.no_grad():
            expected = [to_numpy(t) for t in tree_leaves(self.workload.torch_model()(*inputs))]
        verdict = self.workload.verify_outputs(results, expected)
        if not verdict.ok:
            raise VerificationError(f"{self.workload.spec}: check=True: {verdict.message}")


def _tensor(torch: Any, array: np.ndarray, dtype: str) -> Any:
    """A tensor over ``array`` (bf16: its uint16 bit patterns viewed as bfloat16)."""
    tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if dtype == "bf16" else tensor


def compile_model(
    model: Any,
    example_inputs: Any,
    graph: str | Graph = "x86",
    target: str | None = None,
    threads: int | None = None,
    check: bool = False,
) -> CompiledModel:
    """Import ``model`` on ``example_inputs``, compile it through ``graph`` and wrap it.

    Raises:
        TorchUnavailableError: PyTorch is not installed.
        PayloadError, StageFailed: the import or a stage cannot take the model (named).
    """
    from stagegraph.app.session import SessionRequest, resolve_graph
    from stagegraph.core.catalog import load_graph
    from stagegraph.core.engine import Engine

    workload = from_torch(model, example_inputs)
    base = graph if isinstance(graph, Graph) else load_graph(graph)
    request = SessionRequest(graph=base.name, workload=workload.spec, target=target,
                             threads=threads)  # fmt: skip
    resolved = resolve_graph(base, request, workload.spec)
    with workload.session():
        result = Engine(cache=False).run(resolved, workload)
    return CompiledModel(workload, result.binary, check)


def torch_backend(
    graph: str | Graph = "x86", target: str | None = None, threads: int | None = None
) -> Any:
    """A ``torch.compile`` backend: ``torch.compile(model, backend=sg.torch_backend())``.

    Each graph Dynamo captures is compiled by stagegraph; one it cannot take runs eagerly
    (Dynamo's own GraphModule), with one warning per reason naming it.
    """
    warned: set[str] = set()

    def backend(module: Any, example_inputs: list[Any]) -> Any:
        try:
            return compile_model(module, list(example_inputs), graph, target, threads)
        except StagegraphError as exc:
            reason = " ".join(str(exc).split())
            if reason not in warned:
                warned.add(reason)
                message = f"stagegraph backend: running this graph eagerly: {reason}"
                warnings.warn(StagegraphWarning(message), stacklevel=2)
            return module.forward

    return backend
