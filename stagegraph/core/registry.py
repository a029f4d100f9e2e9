"""One registry mechanism for every kind of name a user can type: stages, graphs, workloads,
cost models, stage-library modules, targets, peers, artifact kinds.

A :class:`Registry` maps a name to an entry: the object itself, or a ``"module:attribute"``
string imported on first lookup (so registering costs nothing and listing loads no MLIR).
Every registry has the same three rules:

- **origin**: each entry records who registered it (``module.qualname`` of the object, or
  the import string);
- **one duplicate rule**: a second entry under a taken name is refused with
  :class:`~stagegraph.errors.DuplicateNameError` unless it has the same origin (a re-import
  of the same code is no clash);
- **one "did you mean"**: an unknown name raises the registry's own error type (a
  :class:`~stagegraph.errors.StagegraphError` subclass that is also a ``KeyError``) with
  close matches from :func:`difflib.get_close_matches` and the list of known names.

Registries fill lazily: before answering a lookup or a listing each one runs its
``discover`` hooks, loads the built-in providers (packages such as ``stagegraph.stages``
that register themselves, named by ``stagegraph.PROVIDERS``) and the plugins. Every
registry joins an index (:func:`registries`) by its plural name, which is what
``stagegraph list KIND`` lists.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from stagegraph.errors import (
    DuplicateNameError,
    StagegraphError,
    UnknownNameError,
    unknown_name_message,
)

T = TypeVar("T")

_PROVIDERS: list[str] = []
_providers_loaded: set[str] = set()
_INDEX: dict[str, Registry[Any]] = {}


def provide(module: str) -> None:
    """Name one more package whose import registers built-in entries (loaded with those of
    ``stagegraph.PROVIDERS``, the package's own)."""
    if module not in _PROVIDERS:
        _PROVIDERS.append(module)


def load_providers() -> None:
    """Import the built-in providers (once each), then the plugins."""
    package = importlib.import_module(__name__.partition(".")[0])
    for module in [*getattr(package, "PROVIDERS", ()), *_PROVIDERS]:
        if module not in _providers_loaded:
            _providers_loaded.add(module)
            importlib.import_module(module)
    from stagegraph.core.plugins import ensure_plugins

    ensure_plugins()


def origin_of(entry: object) -> str:
    """Who defines ``entry``: an import string as written, else ``module.qualname``."""
    if isinstance(entry, str):
        return entry
    owner = getattr(entry, "__self__", None)  # a bound method: its class names it
    fn = type(owner) if owner is not None and not isinstance(owner, type) else entry
    fn = getattr(fn, "__func__", fn)
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None)
    if module and name:
        return f"{module}.{name}"
    return f"{type(entry).__module__}.{type(entry).__qualname__} {entry!r}"


def import_entry(spec: str) -> Any:
    """The object an import string ``"module:attribute"`` names (``"module"``: the module).

    Raises:
        ImportError, AttributeError: the module or the attribute does not exist.
    """
    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module


class Registry(Generic[T]):
    """Names of one kind, each to an entry (an object or a lazy ``"module:attr"`` string).

    Args:
        kind: the singular noun in messages (``"cost model"``).
        unknown_as: the noun of the unknown-name message, if not ``kind`` (``"stage
            factory"``).
        discover_first: run ``discover`` before registering too, so that a user's entry
            can never take a shipped name that discovery would find later.
        plural: the index and listing name (``"cost-models"``); default ``kind + "s"``.
        error: the error raised for an unknown name.
        discover: called before a lookup or listing (e.g. index shipped files); may run
            more than once, so it must be idempotent.
        resolve: turns a looked-up entry into the value :meth:`get` returns (default:
            import a string entry, keep an object).
    """

    def __init__(
        self,
        kind: str,
        *,
        plural: str | None = None,
        error: type[StagegraphError] = UnknownNameError,
        discover: Callable[[], None] | None = None,
        resolve: Callable[[str, Any], T] | None = None,
        unknown_as: str | None = None,
        discover_first: bool = False,
    ) -> None:
        self.kind = kind
        self.unknown_as = unknown_as or kind
        self.plural = plural or f"{kind.replace(' ', '-')}s"
        self.error = error
        self._discover = discover
        self._resolve = resolve
        self._discover_first = discover_first
        self._entries: dict[str, Any] = {}
        self._origins: dict[str, str] = {}
        self._resolved: dict[str, T] = {}
        _INDEX[self.plural] = self

    def register(self, name: str, entry: Any, origin: str | None = None) -> Any:
        """Add ``entry`` under ``name`` and return it (usable as a decorator's body).

        Raises:
            DuplicateNameError: another origin already registered ``name``.
        """
        origin = origin or origin_of(entry)
        if self._discover_first and self._discover is not None:
            self._discover()
        taken = self._origins.get(name)
        if taken is not None and taken != origin:
            raise DuplicateNameError(
                f"{self.kind} name {name!r} is already registered by {taken}; {origin} must "
                f"use another name"
            )
        self._entries[name] = entry
        self._origins[name] = origin
        self._resolved.pop(name, None)
        return entry

    def add_shipped(self, name: str, entry: Any, origin: str) -> None:
        """Discovery's registration: ``entry`` under ``name`` unless something has it."""
        if name not in self._entries:
            self._entries[name] = entry
            self._origins[name] = origin

    def load(self) -> None:
        """Fill the registry: its own discovery, the built-in providers, the plugins."""
        load_providers()
        if self._discover is not None:
            self._discover()

    def names(self) -> list[str]:
        """Every registered name, sorted (after loading)."""
        self.load()
        return sorted(self._entries)

    def origin(self, name: str) -> str:
        """Who registered ``name`` (raises the unknown-name error for a name not there)."""
        self._require(name)
        return self._origins[name]

    def entry(self, name: str) -> Any:
        """The entry as registered (an import string stays a string)."""
        self._require(name)
        return self._entries[name]

    def get(self, name: str) -> T:
        """The value registered under ``name``, its import string resolved once.

        Raises:
            the registry's error type: ``name`` is unknown (with a "did you mean").
        """
        if name in self._resolved:
            return self._resolved[name]
        entry = self.entry(name)
        if self._resolve is not None:
            value = self._resolve(name, entry)
        else:
            value = import_entry(entry) if isinstance(entry, str) else entry
        self._resolved[name] = value
        return value

    def items(self) -> Iterator[tuple[str, T]]:
        """``(name, value)`` for every name, each resolved."""
        for name in self.names():
            yield name, self.get(name)

    def __contains__(self, name: object) -> bool:
        if name not in self._entries:
            self.load()
        return name in self._entries

    def unknown(self, name: str, where: str = "") -> StagegraphError:
        """The error for an unknown ``name``: close matches and the known names."""
        return self.error(unknown_name_message(self.unknown_as, name, self._entries, where))

    def _require(self, name: str) -> None:
        if name not in self:
            raise self.unknown(name)


def registries() -> dict[str, Registry[Any]]:
    """Every registry by plural name (``stages``, ``graphs``, ``cost-models``, ...), those
    of the modules imported so far; ``stagegraph list`` imports the ones it lists."""
    return dict(sorted(_INDEX.items()))
