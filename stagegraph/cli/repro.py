"""``stagegraph repro``: re-run the failing stage a reproducer directory recorded."""

from __future__ import annotations

import click

from stagegraph.cli.output import emit_json


@click.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def repro(directory: str, as_json: bool) -> None:
    """Re-run the failing stage recorded in a reproducer DIRECTORY on its input."""
    from stagegraph.instrument.repro import replay

    result = replay(directory)
    if as_json:
        emit_json(result)
    else:
        click.echo(f"stage {result['stage']!r} ran without error (the failure did not reproduce)")
