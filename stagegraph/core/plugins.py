"""Plugins: user code imported before a command runs, so that the graphs, workloads, stages
and cost models it registers work by name exactly like the built-in ones.

Three sources, all spelled ``FILE.py`` or ``MODULE``:

- ``stagegraph --plugin SPEC COMMAND ...`` (repeatable) or :func:`load_plugin` in Python;
- the ``STAGEGRAPH_PLUGINS`` environment variable (``os.pathsep``-separated);
- installed packages, through entry points in the group ``stagegraph.plugins`` (the
  entry point names a module, imported, or a function, called without arguments).

Graphs are rebuilt *by name* in other processes (the ``--isolate`` child, tuning workers,
MPI ranks), so those processes must load the same plugins: a
:class:`~stagegraph.app.session.SessionRequest` carries :func:`loaded_plugins`, and process
launchers pass :func:`plugins_environment` on. A plugin file is recorded by its absolute
path, so a child with another working directory still finds it.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Iterable, Mapping
from pathlib import Path

from stagegraph.errors import PluginError, StagegraphError

ENV = "STAGEGRAPH_PLUGINS"
GROUP = "stagegraph.plugins"

_loaded: list[str] = []
_defaults_loaded = False


def normalize(spec: str) -> str:
    """A plugin spec as recorded: a ``.py`` file by absolute path, a module by name."""
    spec = spec.strip()
    return str(Path(spec).expanduser().resolve()) if spec.endswith(".py") else spec


def load_plugin(spec: str) -> None:
    """Import one plugin (``FILE.py`` or ``MODULE``) once per process.

    A file is imported as a module named after its stem, with its folder put on
    ``sys.path``: it can import modules beside it, and the stages it declares can be
    written ``STEM:attribute`` in graph files (what ``stagegraph export`` does).

    Raises:
        PluginError: the file or module does not exist, or importing it raised (the message
            names the plugin and the line that failed).
    """
    spec = normalize(spec)
    if not spec or spec in _loaded:
        return
    _loaded.append(spec)  # first: a plugin that looks names up must not load itself again
    try:
        if spec.endswith(".py"):
            _import_file(Path(spec))
        else:
            importlib.import_module(spec)
    except PluginError:
        _loaded.remove(spec)
        raise
    except ModuleNotFoundError as exc:
        _loaded.remove(spec)
        if exc.name == spec:
            raise PluginError(
                f"plugin {spec!r}: no module named {spec!r} (give an importable module name, "
                f"or the path of a .py file)"
            ) from None
        raise PluginError(f"plugin {spec}: {exc}{where_raised(exc)}") from exc
    except StagegraphError as exc:
        _loaded.remove(spec)
        raise PluginError(f"plugin {spec}: {exc}") from exc
    except Exception as exc:
        _loaded.remove(spec)
        raise PluginError(f"plugin {spec}: {type(exc).__name__}: {exc}{where_raised(exc)}") from exc


def load_plugins(specs: Iterable[str]) -> None:
    """:func:`load_plugin` for each spec, in order."""
    for spec in specs:
        load_plugin(spec)


def ensure_plugins() -> None:
    """Load ``STAGEGRAPH_PLUGINS`` and the installed entry points (once per process).

    Every registry calls this before it answers a lookup or a listing, so plugins from the
    environment and from installed packages are there in library use too, without a call.
    """
    global _defaults_loaded
    if _defaults_loaded:
        return
    _defaults_loaded = True
    load_plugins(split_env(os.environ.get(ENV, "")))
    from importlib.metadata import entry_points

    for point in entry_points(group=GROUP):
        try:
            loaded = point.load()
            if callable(loaded) and not isinstance(loaded, type):
                loaded()
        except StagegraphError as exc:
            raise PluginError(f"plugin entry point {point.name!r} ({point.value}): {exc}") from exc
        except Exception as exc:
            raise PluginError(
                f"plugin entry point {point.name!r} ({point.value}): "
                f"{type(exc).__name__}: {exc}{where_raised(exc)}"
            ) from exc


def split_env(value: str) -> list[str]:
    """The plugin specs of a ``STAGEGRAPH_PLUGINS`` value (``os.pathsep``-separated)."""
    return [part for part in value.split(os.pathsep) if part.strip()]


def loaded_plugins() -> tuple[str, ...]:
    """The plugins this process loaded from ``--plugin``/:func:`load_plugin` and the
    environment, in order (entry points load everywhere by themselves)."""
    return tuple(_loaded)


def plugins_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default ``os.environ``) with ``STAGEGRAPH_PLUGINS`` naming every loaded
    plugin: what a subprocess needs to see this process's registrations."""
    result = dict(os.environ if env is None else env)
    specs = [*split_env(result.get(ENV, "")), *_loaded]
    merged = list(dict.fromkeys(normalize(s) for s in specs))
    if merged:
        result[ENV] = os.pathsep.join(merged)
    return result


def _import_file(path: Path) -> None:
    if not path.is_file():
        raise PluginError(f"plugin file {path} does not exist")
    name = path.stem
    if not name.isidentifier():
        raise PluginError(f"plugin file {path}: {name!r} is not a valid module name")
    existing = sys.modules.get(name)
    if existing is not None:
        where = getattr(existing, "__file__", None)
        if where is None or Path(where).resolve() != path:
            raise PluginError(
                f"plugin file {path}: the module name {name!r} is already taken by "
                f"{where or 'a built-in module'}; rename the file"
            )
        return
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    importlib.invalidate_caches()
    module = importlib.import_module(name)
    if Path(module.__file__ or "").resolve() != path:
        raise PluginError(f"plugin file {path}: importing {name!r} found {module.__file__}")


def where_raised(exc: BaseException) -> str:
    """`` (at FILE:LINE)`` of the innermost frame of a plugin's failure."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {last.filename}:{last.lineno})"
