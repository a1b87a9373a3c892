"""The ``allocator`` command line. Heavy libraries are imported inside the commands that need
them, so ``allocator --help`` is instant and a serving install without the training extras
still runs the commands it has."""

from __future__ import annotations

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
    """A group whose ``request`` command (the serving client's) is imported only when run or
    listed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), "request"])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name == "request":
            # grpcio: imported when the command is run or listed, not with the CLI
            from allocator.serving.request_cli import request_command

            return request_command
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
