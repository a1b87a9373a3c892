"""The ``allocator`` command line: one entry point, a command group per module.

Heavy libraries (pandas, torch, onnxruntime, sqlalchemy) are imported inside the commands that
need them, so ``allocator --help`` is instant and a serving install without the training extras
still runs the commands it has.
"""

from __future__ import annotations

import importlib
from typing import ClassVar

import click

from allocator import __version__
from allocator.cli import (
    backtest,
    checkpoint,
    data,
    db,
    demo,
    export,
    jobs,
    serve,
    suite,
    trade,
    train,
)


class LazyGroup(click.Group):
    """A group whose commands defined outside the CLI are imported only when run (or listed)."""

    lazy: ClassVar[dict[str, tuple[str, str]]] = {
        # the serving client's command: grpcio and numpy only, imported when run or listed
        "request": ("allocator.serving.request_cli", "request_command")
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            module, attribute = self.lazy[name]
            return getattr(importlib.import_module(module), attribute)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="allocator")
def main() -> None:
    """Allocator: reinforcement-learning portfolio allocation, from training to serving."""


for command in (
    data.data,
    backtest.backtest,
    train.train,
    checkpoint.checkpoint,
    export.export,
    demo.demo,
    serve.serve,
    db.db,
    jobs.retrain,
    jobs.walk_forward,
    jobs.tune,
    suite.suite,
    trade.trade,
):
    main.add_command(command)
