"""Commands registered on the CLI beyond the core ones (filled as features land)."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
