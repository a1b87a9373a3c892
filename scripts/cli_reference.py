#!/usr/bin/env python
"""Render the command-line reference (Markdown) from the ``allocator`` click commands.

Walks the command tree the way ``allocator --help`` does (``list_commands`` and
``get_command``, so lazily loaded commands such as ``allocator request`` are included) and
writes, per command: its help, its usage line, and its options with click's own help records
(defaults and choices as ``--help`` prints them). The docs site builds its "Command line" page
from this at build time (scripts/docs_hooks.py); run it alone to print the page.

Usage:
  python scripts/cli_reference.py
"""

from __future__ import annotations

import html
import inspect
import sys
from collections.abc import Iterator

import click


def _walk(
    command: click.Command, name: str, parent: click.Context | None = None
) -> Iterator[tuple[click.Command, click.Context]]:
    """Each command with its context, depth first, subcommands in ``--help`` order."""
    # context_settings as click applies them (``-h`` beside ``--help``, inherited)
    ctx = command.context_class(command, info_name=name, parent=parent, **command.context_settings)
    yield command, ctx
    if isinstance(command, click.Group):
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, sub_name, ctx)


def _text(text: str) -> str:
    """Help text as Markdown prose: click's ``\\b`` markers dropped, HTML characters escaped."""
    lines = [line for line in inspect.cleandoc(text).splitlines() if line.strip() != "\b"]
    return html.escape("\n".join(lines), quote=False)


def _cell(text: str) -> str:
    return html.escape(" ".join(text.split()), quote=False).replace("|", "\\|")


def anchor(path: str) -> str:
    """The heading id the site gives ``allocator data info``."""
    return path.replace(" ", "-")


def _section(command: click.Command, ctx: click.Context) -> list[str]:
    path = ctx.command_path
    out = [f"## `{path}` {{#{anchor(path)}}}", ""]
    if command.help:
        out += [_text(command.help), ""]
    usage = " ".join([path, *command.collect_usage_pieces(ctx)])
    out += ["```text", usage, "```", ""]
    records = [p.get_help_record(ctx) for p in command.get_params(ctx)]
    rows = [r for r in records if r is not None]
    if rows:
        out += ["| option | description |", "| --- | --- |"]
        out += [f"| `{opts}` | {_cell(help_text)} |" for opts, help_text in rows]
        out.append("")
    if isinstance(command, click.Group):
        out += ["Commands:", ""]
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                summary = _cell(sub.get_short_help_str(limit=100))
                out.append(f"- [`{sub_name}`](#{anchor(f'{path} {sub_name}')}): {summary}")
        out.append("")
    return out


def render(command: click.Command | None = None, name: str = "allocator") -> str:
    """The whole reference page: one section per command, the root first."""
    if command is None:
        from allocator.cli import main

        command = main
    out = [
        "# Command line",
        "",
        f"Every `{name}` command, generated from the click commands when the site is built "
        f"(`scripts/cli_reference.py`); `{name} COMMAND --help` prints the same.",
        "",
    ]
    for cmd, ctx in _walk(command, name):
        out += _section(cmd, ctx)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
