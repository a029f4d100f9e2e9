"""Click options generated from the request models: each option's flag, type, bounds,
default and help come from the model field that declares it (see
:mod:`stagegraph.core.options`), so the command line cannot disagree with the API."""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from typing import Any

import click

from stagegraph.core.options import OptionSpec


def click_option(spec: OptionSpec) -> Callable[[Callable], Callable]:
    """The click option of one spec (its keyword is the destination)."""
    names = [n for n in (spec.option.short, spec.flag) if n]
    kwargs: dict[str, Any] = {"help": spec.help}
    if spec.option.metavar:
        kwargs["metavar"] = spec.option.metavar
    annotation = spec.annotation
    if annotation is bool:
        return click.option(*names, spec.keyword, is_flag=True, **kwargs)
    if spec.multiple:
        return click.option(*names, spec.keyword, multiple=True, **kwargs)
    default = spec.cli_default
    if default is not None:
        kwargs.update(default=default, show_default=True)
    return click.option(*names, spec.keyword, type=_click_type(spec, annotation), **kwargs)


def _click_type(spec: OptionSpec, annotation: Any) -> Any:
    if typing.get_origin(annotation) is typing.Literal:
        return click.Choice([str(a) for a in typing.get_args(annotation)])
    bounds = spec.bounds()
    low = bounds.get("ge", bounds.get("gt"))
    if annotation is int and spec.option.scale is None:
        return click.IntRange(min=low, min_open="gt" in bounds) if bounds else int
    if annotation in (int, float):
        return click.FloatRange(min=low, min_open="gt" in bounds) if bounds else float
    if spec.option.path == "dir":
        return click.Path(file_okay=False)
    if spec.option.path == "file":
        return click.Path(dir_okay=False)
    return str


def model_options(specs: Mapping[str, OptionSpec]) -> Callable[[Callable], Callable]:
    """A decorator adding every option of ``specs`` to a click command, in their order."""

    def decorate(command: Callable) -> Callable:
        for spec in reversed(list(specs.values())):
            command = click_option(spec)(command)
        return command

    return decorate


def session_options(*keywords: str) -> Callable[[Callable], Callable]:
    """Some of the session request's options (``session_options("param", "target")``), for
    a command of its own that opens a session (its values go to :func:`session_request`)."""
    from stagegraph.app.session import SessionRequest
    from stagegraph.core.options import option_specs, select

    return model_options(select(option_specs(SessionRequest), keywords))


def session_request(options: Mapping[str, Any]) -> Any:
    """The :class:`~stagegraph.app.session.SessionRequest` of a command's click values
    (``graph``, ``workload`` and the keywords of :func:`session_options`)."""
    from stagegraph.app.session import request_from_options

    return request_from_options(options["graph"], options["workload"], options)


def json_option(command: Callable) -> Callable:
    """``--json``: the command prints one JSON document instead of text."""
    return click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")(command)


def console(as_json: bool, describe_cost_model: bool = True) -> Any:
    """What a terminal adds to a command: IR printing on stderr, a progress line (on a
    terminal, without ``--json``), the cost model's description."""
    from stagegraph.app.commands import Console

    return Console(print_ir, progress_hooks(as_json), describe_cost_model)


def progress_hooks(as_json: bool) -> list:
    """A progress line for long compiles, on a terminal and without ``--json`` only."""
    import sys

    if as_json or not sys.stderr.isatty():
        return []
    from stagegraph.instrument.progress import Progress

    return [Progress(sys.stderr)]


def print_ir(text: str) -> None:
    """Where ``--print-ir-after`` text goes: stderr, so ``--json`` output stays clean."""
    click.echo(text, err=True)
