"""Graph files: a YAML/JSON form of a graph, validated by pydantic with file locations.

```yaml
name: demo
inputs:
  payload: {type: module:tensor, tags: [input]}
stages:
  - {name: bufferize, factory: bufferize, tags: [bufferized]}
edges:
  - payload -> bufferize.module
```
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator

from stagegraph.core.graph import Graph, GraphInput
from stagegraph.core.ports import GRAPH_PATH, LEVELS, Module, Schema
from stagegraph.core.stage import StageFactory, get_factory
from stagegraph.errors import GraphError, GraphFileError, InvalidGraphError

EDGE_PATTERN = r"^\s*[\w-]+(\.[\w-]+)?\s*->\s*[\w-]+\.[\w-]+\s*$"


class InputEntry(Schema):
    """A graph input: ``module:LEVEL`` or ``package.module:ModelClass``."""

    type: str = "module:tensor"
    tags: list[str] = Field(default_factory=list)

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        resolve_type(value)
        return value


class StageEntry(Schema):
    name: str = Field(pattern=r"^[\w-]+$")
    factory: str
    config: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)


class GraphFile(Schema):
    """The schema of a graph file (``stagegraph schema`` prints it as JSON Schema)."""

    name: str
    description: str = ""
    inputs: dict[str, InputEntry] = Field(default_factory=lambda: {"payload": InputEntry()})
    stages: list[StageEntry]
    edges: list[str] = Field(default_factory=list)
    default_splice: str | None = None

    @field_validator("edges")
    @classmethod
    def _edge_syntax(cls, edges: list[str]) -> list[str]:
        import re

        for edge in edges:
            if not re.match(EDGE_PATTERN, edge):
                raise ValueError(f"edge {edge!r} must look like 'stage.port -> stage.port'")
        return edges


def resolve_type(text: str) -> type:
    """Port type from its file spelling: ``module:tensor`` or ``pkg.mod:Class``."""
    kind, _, rest = text.partition(":")
    if kind == "module":
        if rest not in LEVELS:
            raise ValueError(f"unknown IR level {rest!r}; levels are {', '.join(LEVELS)}")
        return Module[rest]
    try:
        return getattr(importlib.import_module(kind), rest)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"unknown port type {text!r}: {exc}") from None


def type_spelling(port_type: type) -> str:
    if issubclass(port_type, Module):
        return f"module:{port_type.level}"
    return f"{port_type.__module__}:{port_type.__qualname__}"


def factory_spelling(factory: StageFactory) -> str:
    """How a graph file names ``factory``: built-in stages by registry name; user stages
    (plugins, modules beside a graph file) by ``module:attribute``, which imports the code
    that declares them wherever the file is loaded, with or without the plugin; a stage
    whose module cannot be imported again (``__main__``) by its registry name."""
    try:
        registered = get_factory(factory.name) is factory
    except GraphError:
        registered = False
    fn = getattr(factory.fn, "__func__", factory.fn)
    owner = getattr(factory.fn, "__self__", None)
    module_name = (type(owner) if owner is not None else fn).__module__
    if registered and module_name.startswith("stagegraph."):
        return factory.name
    module = sys.modules.get(module_name)
    attr = next(
        (key for key, value in vars(module).items() if value is factory),
        None,
    ) if module is not None else None  # fmt: skip
    importable = module_name not in ("__main__", "__mp_main__") and not module_name.startswith(
        "stagegraph._user_graphs."
    )
    if attr is not None and importable:
        return f"{module_name}:{attr}"
    if registered:
        return factory.name
    return f"{module_name}:{fn.__name__}"


def to_file_model(graph: Graph) -> GraphFile:
    """The file form of a graph (stages named as :func:`factory_spelling` says)."""
    rank = {node: i for i, node in enumerate(graph.order())}
    stages = []
    for stage in sorted(graph.stages.values(), key=lambda s: rank[s.name]):
        stages.append(
            StageEntry(
                name=stage.name,
                factory=factory_spelling(stage.factory),
                config=stage.config.model_dump(mode="json", exclude_defaults=True),
                tags=sorted(stage.tags),
            )
        )
    inputs = {
        i.name: InputEntry(type=type_spelling(i.type), tags=sorted(i.tags))
        for i in graph.inputs.values()
    }
    return GraphFile(
        name=graph.name,
        description=graph.description,
        inputs=inputs,
        stages=stages,
        edges=[str(e) for e in sorted(graph.edges, key=lambda e: (rank[e.dst], rank[e.src], e))],
        default_splice=graph.default_splice,
    )


def graph_text(graph: Graph, fmt: str = "yaml") -> str:
    """A graph as the text of a graph file, ``fmt`` ``"yaml"`` or ``"json"``; loading it
    gives an equal graph (:func:`graph_from_text`)."""
    data = to_file_model(graph).model_dump(mode="json", exclude_defaults=True)
    data.setdefault("name", graph.name)
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False)
    return json.dumps(data, indent=2) + "\n"


def dump_graph(graph: Graph, path: str | Path) -> None:
    """Write a graph as YAML (``.yaml``/``.yml``) or JSON (anything else)."""
    path = Path(path)
    text = graph_text(graph, "yaml" if path.suffix in (".yaml", ".yml") else "json")
    try:
        path.write_text(text)
    except OSError as exc:
        raise GraphFileError(f"cannot write graph file {path}: {exc.strerror}") from None


def load_graph_file(path: str | Path) -> Graph:
    """Read, validate and build a graph file; errors name the file, line and field."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise GraphFileError(f"cannot read graph file {path}: {exc.strerror}") from None
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)  # ``factory: my_stages:cleanup`` may name a module beside it
    return graph_from_text(text, str(path), base_dir=path.parent)


def graph_from_text(
    text: str, source: str = "<graph>", base_dir: str | Path | None = None
) -> Graph:
    """Build a graph from YAML/JSON text; config paths resolve relative to ``base_dir``."""
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise GraphFileError(f"{where}: invalid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise GraphFileError(f"{source}: a graph file must be a mapping with 'name' and 'stages'")
    try:
        model = GraphFile.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"{_locate(root, err['loc'], source)}: {'.'.join(map(str, err['loc'])) or 'file'}: "
            f"{err['msg']}"
            for err in exc.errors()
        ]
        raise GraphFileError(f"{source}: invalid graph file:\n  " + "\n  ".join(problems)) from None
    return graph_from_model(model, source, base_dir)


def resolve_paths(factory: Any, config: dict[str, Any], base_dir: str | Path | None) -> dict:
    """``config`` with its relative path fields (marked ``GRAPH_PATH``) joined to
    ``base_dir``: files named in a graph file are found next to it, wherever it is run."""
    if base_dir is None:
        return config
    resolved = dict(config)
    for name, info in factory.config_model.model_fields.items():
        value = resolved.get(name)
        if GRAPH_PATH in info.metadata and isinstance(value, str) and value:
            path = Path(value).expanduser()
            resolved[name] = str(path if path.is_absolute() else Path(base_dir) / path)
    return resolved


def graph_from_model(
    model: GraphFile, source: str = "<graph>", base_dir: str | Path | None = None
) -> Graph:
    stages = []
    for entry in model.stages:
        try:
            factory = get_factory(entry.factory)
            config = resolve_paths(factory, entry.config, base_dir)
            stages.append(factory(entry.name, tags=entry.tags, config=config))
        except GraphError as exc:
            raise GraphFileError(f"{source}: stage {entry.name!r}: {exc}") from None
        except Exception as exc:  # config validation
            raise GraphFileError(f"{source}: {exc}") from None
    inputs = [
        GraphInput(name, resolve_type(i.type), frozenset(i.tags))
        for name, i in model.inputs.items()
    ]
    try:
        return Graph(
            model.name,
            stages,
            model.edges,
            inputs,
            default_splice=model.default_splice,
            description=model.description,
        )
    except InvalidGraphError as exc:
        raise InvalidGraphError(f"{model.name} ({source})", exc.problems) from None
    except GraphError as exc:
        raise type(exc)(f"{source}: {exc}") from None


def _locate(root: yaml.Node | None, loc: tuple, source: str) -> str:
    """``file:line:col`` of the YAML node at a pydantic error location (best effort)."""
    node = root
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == part), None)
            if match is None:
                key = next((k for k, _ in node.value if k.value == part), None)
                node = key or node
                break
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            node = node.value[part]
        else:
            break
    if node is None:
        return source
    return f"{source}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"


def json_schema() -> dict[str, Any]:
    """The graph-file schema; each stage's ``config`` is checked against its factory's own
    config schema (an ``if factory == NAME then config: SCHEMA`` branch per registered
    factory; a factory named by import path is checked when the graph is built)."""
    from stagegraph.core.stage import registered

    schema = GraphFile.model_json_schema()
    defs = schema.setdefault("$defs", {})
    branches = []
    for name, factory in sorted(registered().items()):
        config = factory.config_model.model_json_schema(ref_template="#/$defs/{model}")
        config = factory.config_model.schema_for(factory, config)
        for key, value in config.pop("$defs", {}).items():
            defs.setdefault(key, value)
        branches.append(
            {
                "if": {"properties": {"factory": {"const": name}}, "required": ["factory"]},
                "then": {"properties": {"config": config}},
            }
        )
    defs["StageEntry"]["allOf"] = branches
    return schema
