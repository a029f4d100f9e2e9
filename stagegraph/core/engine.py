"""The engine: resolves a graph for one payload.

It orders the stages, hands a mutating consumer of a module that another stage reads or
changes its own copy, serves unchanged stages from a content-keyed memo cache (bounded in
bytes), captures MLIR diagnostics, and records a trace. Instrumentation (IR dumps,
reproducers, verification) plugs in through :class:`Hook`.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stagegraph.core.graph import Graph, GraphInput
from stagegraph.core.memo import MEMO_BYTES, FrozenModule, Memo, freeze, unmemoized_hash
from stagegraph.core.ports import Binary, Facts, Module, Params, Schema
from stagegraph.core.stage import Stage
from stagegraph.errors import ConfigError, StageFailed, StagegraphError, StageOutputError

Value = Any
Key = tuple[str, str]
#: Stage kinds never served from the persistent cache (``cache_dir``).
DISK_EXCLUDED_KINDS = frozenset({"emit", "wrapper"})


class StageRecord(Schema):
    """What one stage did in one run."""

    name: str
    kind: str
    seconds: float
    cached: bool = False
    ops_in: int | None = None
    ops_out: int | None = None
    level_in: str | None = None
    level_out: str | None = None


class Trace(Schema):
    """The stages a run executed, in order."""

    graph: str
    records: tuple[StageRecord, ...] = ()

    def executed(self) -> list[str]:
        """Stages that actually ran (not served from the cache)."""
        return [r.name for r in self.records if not r.cached]

    def compile_seconds(self) -> float:
        return sum(r.seconds for r in self.records)


@dataclass
class StageEvent:
    """What hooks see of a stage about to run (or that just ran)."""

    graph: Graph
    stage: Stage
    inputs: dict[str, Value]
    outputs: dict[str, Value] = field(default_factory=dict)
    record: StageRecord | None = None
    #: Bytecode bytes of the run's payload module (every stage's module carries its
    #: weights): hooks that copy modules decide by it (None: not measured).
    module_bytes: int | None = None


class Hook:
    """The one instrumentation seam: subclass and override what you need."""

    def before_stage(self, event: StageEvent) -> None:
        """Called with the stage's inputs before it runs (or is served from the cache)."""

    def after_stage(self, event: StageEvent) -> None:
        """Called with inputs, outputs and the record after the stage."""

    def on_failure(self, event: StageEvent, error: BaseException) -> str | None:
        """Called when the stage raised; may return a reproducer path for the error."""
        return None

    def on_warning(self, message: str) -> None:
        """Called with a warning of the engine (e.g. a bad cache entry that was ignored)."""


@dataclass
class RunResult:
    """Values computed by one run, addressable by ``(node, port)``, and the trace."""

    graph: Graph
    values: dict[Key, Value]
    trace: Trace
    last: str

    def value(self, node: str, port: str | None = None) -> Value:
        if port is None:
            ports = [p for n, p in self.values if n == node]
            if len(ports) != 1:
                raise KeyError(f"stage {node!r} has outputs {ports}; name one")
            port = ports[0]
        return self.values[(node, port)]

    def _latest(self, kind: type) -> Value:
        for node in reversed(self.graph.order()):
            for (n, _), v in self.values.items():
                if n == node and isinstance(v, kind):
                    return v
        return None

    @property
    def module(self) -> Module | None:
        """The module produced last (at ``until``, the tagged stage's module)."""
        for (n, _), v in self.values.items():
            if n == self.last and isinstance(v, Module):
                return v
        return self._latest(Module)

    @property
    def params(self) -> Params | None:
        return self._latest(Params)

    @property
    def facts(self) -> Facts | None:
        return self._latest(Facts)

    @property
    def binary(self) -> Binary | None:
        return self._latest(Binary)


def content_hash(value: Value) -> str:
    if hasattr(value, "content_hash"):
        return value.content_hash()
    return hashlib.sha256(repr(value).encode()).hexdigest()


class Engine:
    """Runs graphs. Keep one engine to reuse its memo cache across runs.

    Args:
        hooks: instrumentation (see :class:`Hook`).
        cache: memoize stage results in this process.
        context: the MLIR context (default: a new one on first use).
        cache_dir: also keep stage results in this folder, so another process (a second
            ``--cache DIR`` run) replays unchanged stages (see :mod:`stagegraph.core.cache`).
        memo_bytes: the most bytes of frozen modules the memo keeps (see
            :mod:`stagegraph.core.memo`: a real-size model's modules do not fit).
    """

    def __init__(
        self,
        hooks: Iterable[Hook] = (),
        cache: bool = True,
        context: Any = None,
        cache_dir: str | None = None,
        memo_bytes: int = MEMO_BYTES,
    ):
        self.hooks = list(hooks)
        self.cache_enabled = cache
        self.cache_dir = cache_dir
        self._context = context
        self._cache = Memo(memo_bytes)
        self._module_bytes: int | None = None  # of the current run's payload module
        self._disk: Any = None

    @property
    def disk(self) -> Any:
        """The :class:`~stagegraph.core.cache.DiskCache` of ``cache_dir`` (None without)."""
        if self.cache_dir is None or not self.cache_enabled:
            return None
        if self._disk is None:
            from stagegraph.core.cache import DiskCache

            self._disk = DiskCache(self.cache_dir, self.versions, self.warn)
        return self._disk

    def warn(self, message: str) -> None:
        """Tell the hooks, and Python's warnings (the CLI prints them), about ``message``."""
        import warnings

        from stagegraph.errors import StagegraphWarning

        for hook in self.hooks:
            hook.on_warning(message)
        warnings.warn(message, StagegraphWarning, stacklevel=2)

    @property
    def context(self) -> Any:
        """The MLIR context every module of this engine lives in (created on first use)."""
        if self._context is None:
            from stagegraph.mlir.bindings import new_context

            self._context = new_context()
        return self._context

    @functools.cached_property
    def versions(self) -> str:
        """stagegraph's and the bindings' versions: part of every cache key."""
        from importlib import metadata

        from stagegraph.mlir.bindings import binding_version

        try:
            own = metadata.version("stagegraph")
        except metadata.PackageNotFoundError:
            own = "unknown"
        return f"stagegraph=={own};{binding_version()}"

    def clear_cache(self) -> None:
        self._cache.clear()

    # -- inputs -------------------------------------------------------------------------------

    def payload_inputs(self, graph: Graph, source: Any) -> dict[str, Value]:
        """Bind a workload, a module or a mapping to the graph's inputs."""
        if isinstance(source, Mapping):
            return dict(source)
        module_inputs = [i for i in graph.inputs.values() if issubclass(i.type, Module)]
        if len(module_inputs) != 1:
            raise StagegraphError(
                f"graph {graph.name!r} has {len(module_inputs)} module inputs; "
                "pass a mapping from input name to value"
            )
        if hasattr(source, "payload"):
            source = source.payload(self.context)
        return {module_inputs[0].name: source}

    def _bind_input(self, graph: Graph, node: GraphInput, value: Value) -> Value:
        if isinstance(value, Module):
            return value
        if isinstance(value, str) and issubclass(node.type, Module):
            from stagegraph.mlir.diagnostics import parse_module

            value = parse_module(value, self.context, source=f"input {node.name!r}")
        if issubclass(node.type, Module):
            return node.type(value)
        return value

    # -- running ------------------------------------------------------------------------------

    def run(self, graph: Graph, source: Any, until: str | None = None) -> RunResult:
        """Resolve ``graph`` for ``source`` (a workload, module or input mapping).

        Args:
            until: a tag (or node name); stop after that node.

        Raises:
            StageFailed: a stage raised; the error names the stage and carries diagnostics.
        """
        provided = self.payload_inputs(graph, source)
        self._module_bytes = None
        order = graph.order()
        last = order[-1]
        if until is not None:
            last = graph.node_for_tag(until)
            keep = graph.ancestors(last) | {last}
            order = [n for n in order if n in keep]
        executing = set(order)
        unread: dict[Key, int] = {}  # per value, the edges into stages still to run
        mutators: dict[Key, int] = {}  # per value, the stages that change it in place
        for e in graph.edges:
            if e.dst in executing:
                unread[(e.src, e.src_port)] = unread.get((e.src, e.src_port), 0) + 1
                if e.dst in graph.stages and graph.stages[e.dst].factory.mutates:
                    mutators[(e.src, e.src_port)] = mutators.get((e.src, e.src_port), 0) + 1
        values: dict[Key, Value] = {}
        hashes: dict[Key, str] = {}
        counts: dict[Key, int | None] = {}  # ops of each module output, counted once
        records: list[StageRecord] = []
        for node in order:
            if node in graph.inputs:
                spec = graph.inputs[node]
                if node not in provided:
                    raise StagegraphError(f"graph {graph.name!r}: no value for input {node!r}")
                value = self._bind_input(graph, spec, provided[node])
                values[(node, "value")] = value
                hashes[(node, "value")] = self._input_hash(value)
                continue
            stage = graph.stages[node]
            inputs, input_hashes = {}, {}
            ops_in = None
            for e in graph.in_edges(node):
                value = values[(e.src, e.src_port)]
                if isinstance(value, Module) and ops_in is None:
                    ops_in = counts.get((e.src, e.src_port))
                unread[(e.src, e.src_port)] -= 1
                # A copy when another stage still reads the module, or another changes it
                # too (each branch of a fan-out keeps its own); the only one that changes
                # it, reading it after every other reader, takes it as it is (a model's
                # weights are not copied for nothing).
                still_read = unread[(e.src, e.src_port)] > 0
                if (
                    isinstance(value, Module)
                    and stage.factory.mutates
                    and (still_read or mutators.get((e.src, e.src_port), 0) > 1)
                ):
                    value = value.clone()
                inputs[e.dst_port] = value
                input_hashes[e.dst_port] = hashes[(e.src, e.src_port)]
            outputs, out_hashes, record = self._run_stage(
                graph, stage, inputs, input_hashes, ops_in
            )
            records.append(record)
            for port, value in outputs.items():
                values[(node, port)] = value
                hashes[(node, port)] = out_hashes[port]
                if isinstance(value, Module):
                    counts[(node, port)] = record.ops_out
        return RunResult(graph, values, Trace(graph=graph.name, records=tuple(records)), last)

    def _input_hash(self, value: Value) -> str:
        """The hash of a graph input; a module's bytecode size is noted on the way (see
        :attr:`StageEvent.module_bytes`)."""
        if not isinstance(value, Module):
            return content_hash(value) if self.cache_enabled else ""
        _, digest, size = freeze(value, 0)
        self._module_bytes = max(self._module_bytes or 0, size)
        return digest if self.cache_enabled else ""

    def _run_stage(
        self,
        graph: Graph,
        stage: Stage,
        inputs: dict[str, Value],
        input_hashes: dict[str, str],
        ops_in: int | None = None,
    ) -> tuple[dict[str, Value], dict[str, str], StageRecord]:
        """Run (or replay from the memo) one stage, between the hooks. ``ops_in``: the op
        count of its module input when the stage that made it counted it already (counting
        walks every op: for a large LLVM-dialect module, a good part of a second)."""
        event = StageEvent(graph, stage, inputs, module_bytes=self._module_bytes)
        for hook in self.hooks:
            hook.before_stage(event)
        key = self._memo_key(stage, input_hashes)
        module_in = next((v for v in inputs.values() if isinstance(v, Module)), None)
        if ops_in is None:
            ops_in = _ops(module_in)
        level_in = module_in.level if module_in else None  # the stage may change it in place
        start = time.perf_counter()
        outputs, out_hashes, cached = self._outputs(graph, stage, event, key)
        seconds = time.perf_counter() - start
        module_out = next((v for v in outputs.values() if isinstance(v, Module)), None)
        record = StageRecord(
            name=stage.name,
            kind=stage.kind,
            seconds=seconds,
            cached=cached,
            ops_in=ops_in,
            ops_out=_ops(module_out),
            level_in=level_in,
            level_out=module_out.level if module_out else None,
        )
        event.outputs, event.record = outputs, record
        for hook in self.hooks:
            hook.after_stage(event)
        return outputs, out_hashes, record

    def _memo_key(self, stage: Stage, input_hashes: dict[str, str]) -> str:
        """The memo key of the stage on these inputs; "" when it is not memoized."""
        if not (self.cache_enabled and stage.factory.cacheable):
            return ""
        # Code and package versions key only what outlives this process (the disk cache):
        # hashing the stages' code parses every module they import.
        persistent = self.disk is not None
        key_data = (
            (self.versions if persistent else "")
            + stage.spec_hash(code=persistent)
            + "".join(f"|{p}={h}" for p, h in sorted(input_hashes.items()))
        )
        return hashlib.sha256(key_data.encode()).hexdigest()

    def _outputs(
        self, graph: Graph, stage: Stage, event: StageEvent, key: str
    ) -> tuple[dict[str, Value], dict[str, str], bool]:
        """The stage's outputs and their hashes, served from the memo (or the disk cache)
        under ``key`` or computed and stored there; and whether they were served."""
        cacheable = bool(key)
        # A stage without inputs reads its environment (the target stage reads the host):
        # valid for this process, not for the next run or another machine sharing the folder.
        # Emit and benchmark-wrapper stages always run (Binary outputs; cheap harnesses).
        on_disk = stage.factory.inputs and stage.kind not in DISK_EXCLUDED_KINDS
        disk = self.disk if on_disk else None
        if cacheable and key not in self._cache and disk is not None:
            found = disk.load(key, self.context, stage.name)
            if found is not None:
                self._cache.put(key, *found)
        if cacheable and key in self._cache:
            stored, out_hashes = self._cache.get(key)
            return {p: _thaw(v) for p, v in stored.items()}, out_hashes, True
        outputs = self._call(graph, stage, event)
        if not self.cache_enabled:  # hashes only make memo keys: none without a memo
            return outputs, dict.fromkeys(outputs, ""), False
        stored, out_hashes = {}, {}
        past_budget = (self._module_bytes or 0) > self._cache.budget and disk is None
        for port, value in outputs.items():
            if isinstance(value, Module) and past_budget:  # see stagegraph.core.memo
                stored[port], out_hashes[port] = None, unmemoized_hash()
            elif isinstance(value, Module):  # frozen only within the memo's budget
                stored[port], out_hashes[port], _ = freeze(value, self._cache.budget)
            else:
                stored[port], out_hashes[port] = value, content_hash(value)
        if cacheable:
            if all(v is not None for v in stored.values()):  # else the stage reruns
                self._cache.put(key, stored, out_hashes)
            if disk is not None:
                disk.store(key, stage.name, outputs, out_hashes)
        return outputs, out_hashes, False

    def _call(self, graph: Graph, stage: Stage, event: StageEvent) -> dict[str, Value]:
        from stagegraph.mlir.bindings import ir
        from stagegraph.mlir.diagnostics import capture_diagnostics, error_diagnostics

        try:
            with (
                self.context,
                ir.Location.unknown(),
                capture_diagnostics(self.context) as diagnostics,
            ):
                return stage.run(event.inputs)
        except StageFailed:
            raise
        except StageOutputError as exc:  # the stage's code, not the payload: no reproducer
            raise StageOutputError(f"graph {graph.name!r}: {exc}") from None
        except ConfigError as exc:  # the user's input (--param, a params file): no reproducer
            raise ConfigError(f"stage {stage.name!r} of graph {graph.name!r}: {exc}") from None
        except Exception as exc:
            found = diagnostics + [d for d in error_diagnostics(exc) if d not in diagnostics]
            reason, _, rest = (str(exc).strip() or type(exc).__name__).partition("\n")
            if not found and rest and not isinstance(exc, StagegraphError):
                found = rest.splitlines()  # the interpreter folds diagnostics into its message
            elif rest:
                reason = f"{reason}\n{rest}"
            reproducer = None
            for hook in self.hooks:
                reproducer = hook.on_failure(event, exc) or reproducer
            raise StageFailed(graph.name, stage.name, reason, found, reproducer) from exc


def _thaw(value: Value) -> Value:
    """A memo entry's value as a stage output: modules parsed (or, from the disk cache,
    cloned) afresh, so the stage that consumes it cannot change the entry."""
    if isinstance(value, FrozenModule):
        return value.thaw()
    return value.clone() if isinstance(value, Module) else value


def _ops(module: Module | None) -> int | None:
    if module is None:
        return None
    from stagegraph.mlir.diagnostics import count_ops

    return count_ops(module.ir)
