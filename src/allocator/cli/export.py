"""``allocator export``: a training run, or a seed ensemble of runs, to ONNX in the registry."""

from __future__ import annotations

import click

from allocator.cli.options import failing


@click.command("export")
@click.argument("run_dir", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option(
    "--registry",
    required=True,
    type=click.Path(file_okay=False),
    help="model registry root, e.g. models/ (versions go to REGISTRY/NAME/VERSION)",
)
@click.option("--name", help="registry name (default: the run's manifest name)")
@click.option("--version", help="registry version (default: the next integer)")
def export(run_dir: tuple[str, ...], registry: str, name: str | None, version: str | None) -> None:
    """Export a run to ONNX (policy, and curiosity if trained with it), checked against torch.

    Several RUN_DIRs, runs of one config with different seeds, export as one ensemble: a single
    graph whose action is the mean of the members' actions, served like any model (no
    curiosity graph); the manifest lists its members.
    """
    # heavy (pydantic models, torch, onnx): imported when the command runs, keeps --help instant
    from allocator.artifacts.manifest import read_manifest
    from allocator.trainer import MissingExtraError
    from allocator.trainer.export.errors import ExportError
    from allocator.trainer.export.parity import format_parity
    from allocator.trainer.export.run import export_runs

    with failing(ExportError, MissingExtraError):
        out = export_runs(run_dir, registry, name=name, version=version)
    manifest = read_manifest(out)
    info = manifest.export or {}
    click.echo(f"exported: {out} (opset {info.get('opset')})")
    if manifest.ensemble is not None:
        seeds = ", ".join(str(m.seed) for m in manifest.ensemble.members)
        click.echo(f"ensemble of {len(manifest.ensemble.members)} runs (seeds {seeds})")
    click.echo("parity with torch (max abs difference):")
    click.echo(format_parity(info.get("parity", {})))
