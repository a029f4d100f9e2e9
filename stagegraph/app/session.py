"""One Session behind every entry point: a frozen request in; the resolved graph, workload,
reference, hooks and engine out.

The CLI, the isolated child, each MPI rank, each tuning worker and the benchmark scripts
build a :class:`SessionRequest` (what the user asked: graph, workload, target, overrides,
emit, inspection options) and open a :class:`Session` on it, so a graph is resolved and a
run instrumented the same way wherever it happens. The request is plain data: it crosses
process boundaries (pickle, JSON) where graphs and modules cannot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from stagegraph.app.bench_options import BenchOptions
from stagegraph.core.engine import Engine, Hook, RunResult
from stagegraph.core.graph import Graph
from stagegraph.core.options import Option
from stagegraph.core.plugins import load_plugins, loaded_plugins
from stagegraph.core.ports import Schema

if TYPE_CHECKING:
    from stagegraph.instrument.watchdog import Watchdog


def parse_assignments(items: Sequence[str] | Mapping[str, Any]) -> dict[str, Any]:
    """``KEY=VALUE`` strings (``--param``, ``--fix``) to a dict; values read as YAML scalars
    (``8``, ``true``, ``[1,2]``). A mapping (library use) is taken as it is.

    Raises:
        ConfigError: an item without ``=`` or without a key.
    """
    if isinstance(items, Mapping):
        return dict(items)
    if not items:
        return {}
    import yaml

    from stagegraph.errors import ConfigError

    result: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param {item!r} must look like KEY=VALUE")
        try:
            result[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError:
            result[key.strip()] = raw
    return result


def absolute_path(path: str | None) -> str | None:
    """An absolute path, so child processes (other working directories) agree on it."""
    import os

    return os.path.abspath(path) if path else None


class Inspection(Schema):
    """What to record or check while stages run (``--print-ir-after`` and friends)."""

    print_ir_after: Annotated[
        tuple[str, ...], Option("--print-ir-after", metavar="STAGE|TAG|all")
    ] = Field((), description="Print the IR after these stages (repeatable).")
    verify_each: Annotated[bool, Option("--verify-each")] = Field(
        False, description="Verify the IR after every stage."
    )
    repro_dir: Annotated[str | None, Option("--repro-dir", path="dir")] = Field(
        None, description="Where failing stages write reproducers (default: a temp dir)."
    )
    dump_ir: Annotated[str | None, Option("--dump-ir", path="dir")] = Field(
        None,
        description="Write the IR after every stage into DIR (tune: each candidate's, in "
        "DIR/HASH, after every stage that changed it).",
    )


class SessionRequest(Schema):
    """Everything that decides how a workload is compiled and run (the command line as data).

    ``graph`` is a graph name or file (a :class:`Session` may be given the Graph object
    itself; ``graph`` then only names it in reports); ``params`` are ``--param`` overrides
    of the cost model's choice; ``compile_timeout_s``/``run_timeout_s`` bound an in-process
    run (on by default on the command line; ``None`` for no limit, as in library use).
    ``plugins`` are loaded before anything is resolved: by default the ones this process
    loaded, so a child process that rebuilds the graph by name sees the same plugin
    registrations. The :class:`~stagegraph.core.options.Option` on a field makes it a
    command-line option and an API keyword (see :mod:`stagegraph.app.commands`).
    """

    graph: str
    workload: str
    target: Annotated[str | None, Option("--target", metavar="NAME")] = Field(
        None,
        description="host (default, or $STAGEGRAPH_TARGET), x86-64-v2|v3|v4, or an LLVM CPU "
        "name (znver3, skylake-avx512, sapphirerapids, ...); 'stagegraph list targets'.",
    )
    params: Annotated[
        dict[str, Any],
        Option("--param", keyword="param", metavar="KEY=VALUE", parse=parse_assignments),
    ] = Field(
        default_factory=dict,
        description="Override a field of the cost model's params (validated; repeatable).",
    )
    threads: Annotated[int | None, Option("--threads")] = Field(
        None, ge=1, description="Threads (default: all cores)."
    )
    cost_model: Annotated[str | None, Option("--cost-model", metavar="NAME")] = Field(
        None,
        description="The params stage by name: heuristic (default), analytical, tuned (needs "
        "--db) or fixed (needs --params-file); 'stagegraph list cost-models'. For tune: the "
        "baseline's.",
    )
    db: Annotated[str | None, Option("--db", path="file")] = Field(
        None, description="Tuning database (SQLite) for --cost-model tuned."
    )
    params_file: Annotated[str | None, Option("--params-file", path="file")] = Field(
        None, description="JSON params for --cost-model fixed."
    )
    emit: Annotated[Literal["jit", "object", "shared"], Option("--emit")] = Field(
        "jit",
        description="What the emit stage makes: in-process code, an object file or a "
        "shared library.",
    )
    output: Annotated[str | None, Option("--output", short="-o", path="file")] = Field(
        None, description="Path for --emit object|shared."
    )
    inspection: Inspection = Field(default_factory=Inspection)
    compile_timeout_s: Annotated[float | None, Option("--compile-timeout", cli_default=600.0)] = (
        Field(
            None,
            gt=0,
            description="Without --isolate: end the run if compiling takes longer (s; off in "
            "library calls unless given).",
        )
    )
    run_timeout_s: Annotated[float | None, Option("--run-timeout", cli_default=300.0)] = Field(
        None,
        gt=0,
        description="Without --isolate: end the run if running or timing the compiled code "
        "takes longer (s; bench adds --budget; off in library calls unless given).",
    )
    plugins: tuple[str, ...] = Field(default_factory=loaded_plugins)
    cache_dir: Annotated[
        str | None, Option("--cache", metavar="DIR", parse=absolute_path, path="dir")
    ] = Field(None, description="Keep stage results in DIR: a later run replays unchanged stages.")
    trace_file: Annotated[
        str | None, Option("--trace", metavar="FILE.json", parse=absolute_path, path="file")
    ] = Field(
        None,
        description="Write every stage of every process as Chrome trace events (open in "
        "Perfetto or chrome://tracing; 'stagegraph show GRAPH --trace FILE.json' draws the "
        "timings on the graph).",
    )
    bench: BenchOptions | None = None
    splice_at: Annotated[str | None, Option("--splice-at", metavar="TAG")] = Field(
        None,
        description="Tag after which the timing wrapper is spliced (default: the graph's own "
        "choice).",
    )
    reference: Annotated[str | None, Option("--reference", metavar="GRAPH|none")] = Field(
        None,
        description="Verify against GRAPH's code instead of the stored reference (default: "
        "the .npz, numpy or PyTorch result, else the naive graph); none: run without "
        "verifying.",
    )
    save_payload: Annotated[
        str | None,
        Option("--save-payload", metavar="DIR", parse=absolute_path, path="dir"),
    ] = Field(
        None,
        description="Write a PyTorch workload's imported .mlir and .npz (inputs and eager "
        "reference outputs) to DIR, so the payload reruns without PyTorch.",
    )


def open_workload(spec: str, reference: str | None = None) -> Any:
    """The workload of ``spec`` with the reference ``reference`` asks for (see
    :func:`stagegraph.app.reference.attach_reference`: by default its own, else the naive
    graph's code)."""
    from stagegraph.app.reference import attach_reference
    from stagegraph.workload import parse_workload

    workload = parse_workload(spec)
    attach_reference(workload, reference)
    return workload


class Session:
    """A resolved request: ``graph``, ``workload``, ``hooks`` and the ``engine`` running them.

    Args:
        request: what to resolve.
        write: where ``--print-ir-after`` text goes (the CLI passes its printer; the
            default discards it).
        extra_hooks: more hooks after the inspection ones (a tuning worker's IR dumps).
        run_budget_s: added to the run time limit (a benchmark's sampling budget).
        graph: the graph to use instead of loading ``request.graph`` by name (library use:
            a graph composed in Python; it cannot cross to another process).
        cache: memoize stage results (off for one-shot runs: keys hash the stages' code).

    Raises:
        UnknownGraphError, UnknownWorkloadError, UnknownTargetError, ConfigError: from
            resolving the request, before anything compiles.
    """

    def __init__(
        self,
        request: SessionRequest,
        *,
        write: Callable[[str], None] | None = None,
        extra_hooks: Sequence[Hook] = (),
        run_budget_s: float = 0.0,
        graph: Graph | None = None,
        cache: bool = True,
    ) -> None:
        from stagegraph.core.catalog import load_graph

        load_plugins(request.plugins)
        self.request = request
        self.workload = open_workload(request.workload, request.reference)
        base = graph if graph is not None else load_graph(request.graph)
        self.graph = resolve_graph(base, request, self.workload.spec)
        self.hooks = inspection_hooks(self.graph, request.inspection, write)
        self.hooks += list(extra_hooks)
        from stagegraph.app.memory_passes_hook import MemoryPassesHook

        self.memory_passes = MemoryPassesHook()  # the run report's passes over memory
        self.hooks.append(self.memory_passes)
        self.watchdog: Watchdog | None = None
        if request.compile_timeout_s or request.run_timeout_s:
            from stagegraph.instrument.watchdog import Watchdog

            self.watchdog = Watchdog(
                request.compile_timeout_s or float("inf"),
                (request.run_timeout_s or float("inf")) + run_budget_s,
            )
            self.hooks.append(self.watchdog)
        if request.trace_file:
            from stagegraph.instrument.trace_events import TraceEvents

            self.hooks.append(TraceEvents(request.trace_file))
        self.engine = Engine(self.hooks, cache=cache, cache_dir=request.cache_dir)
        self._prepared = False
        if request.save_payload:
            from stagegraph.workload.torch_model import check_savable

            check_savable(self.workload)

    def prepare_workload(self) -> None:
        """Bring the workload's payload in (a PyTorch model's import), once, under the
        compile time limit and with progress (hooks with ``preparing``): before anything
        asks the workload for its signature."""
        prepare = getattr(self.workload, "prepare", None)
        if self._prepared or not callable(prepare):
            return
        for hook in self.hooks:
            if callable(getattr(hook, "preparing", None)):
                hook.preparing(f"importing the workload {self.workload.spec}")
        prepare()
        self._prepared = True

    def compile(self, until: str | None = None) -> RunResult:
        """Run the graph's stages for the workload (up to the tag ``until``)."""
        self.prepare_workload()
        result = self.engine.run(self.graph, self.workload, until=until)
        if self.request.save_payload:  # imported by now: the stages asked for the payload
            self.workload.save_payload(self.request.save_payload)
        return result

    def close(self) -> None:
        """Stop the hooks that run a thread (time limits, progress): the work is done."""
        for hook in self.hooks:
            stop = getattr(hook, "stop", None)
            if callable(stop):
                stop()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def resolve_graph(graph: Graph, request: SessionRequest, workload_spec: str) -> Graph:
    """The graph with the request's cost model, overrides, threads, target and emitter."""
    from stagegraph.app.graph_options import (
        with_cost_model,
        with_emit,
        with_params,
        with_target,
    )

    graph = with_target(graph, request.target)
    graph = with_cost_model(
        graph,
        request.cost_model,
        workload=workload_spec,
        db=request.db,
        params_file=request.params_file,
    )
    graph = with_params(graph, request.params, request.threads)
    return with_emit(graph, request.emit, request.output, workload_spec)


def inspection_hooks(
    graph: Graph, inspection: Inspection, write: Callable[[str], None] | None = None
) -> list[Hook]:
    """The engine hooks the inspection options ask for (reproducers are always on)."""
    from stagegraph.instrument.ir_hooks import DumpIR, PrintIR, VerifyEach, check_selectors
    from stagegraph.instrument.repro import ReproducerHook

    hooks: list[Hook] = [ReproducerHook(inspection.repro_dir)]
    if inspection.verify_each:
        hooks.append(VerifyEach())
    if inspection.print_ir_after:
        check_selectors(graph, list(inspection.print_ir_after))
        hooks.append(PrintIR(list(inspection.print_ir_after), write or (lambda _text: None)))
    if inspection.dump_ir:
        hooks.append(DumpIR(inspection.dump_ir))
    return hooks


def request_from_options(graph: str, workload: str, options: Mapping[str, Any]) -> SessionRequest:
    """The request for options under their keywords (``param`` as ``KEY=VALUE`` strings or
    a mapping, ``print_ir_after``, ``cache``, ``trace``, ...): one translation, from the
    fields' :class:`~stagegraph.core.options.Option` declarations, for CLI and API."""
    from stagegraph.core.options import model_values, option_specs

    values = model_values(option_specs(SessionRequest), options)
    return SessionRequest(graph=graph, workload=workload, **values)
