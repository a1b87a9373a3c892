"""``allocator checkpoint``: inspect run directories and upgrade them to the current schema."""

from __future__ import annotations

import json

import click

from allocator.cli.options import failing


@click.group()
def checkpoint() -> None:
    """Inspect and migrate training checkpoints (run directories)."""


@checkpoint.command("inspect")
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True, help="print the raw manifest JSON")
def checkpoint_inspect(run_dir: str, as_json: bool) -> None:
    """Print a checkpoint's manifest readably and check its files' sha256."""
    # heavy (pydantic models, torch): imported when the command runs, keeps --help instant
    from allocator.artifacts.manifest import ManifestError, read_manifest, verify_checksums
    from allocator.trainer.checkpoints.manifest import describe

    with failing(ManifestError):
        manifest = read_manifest(run_dir)
        dump = json.dumps(manifest.model_dump(mode="json"), indent=2)
        click.echo(dump if as_json else describe(manifest))
        verify_checksums(run_dir, manifest)
    click.echo("checksums ok")


@checkpoint.command("migrate")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--to-version", type=int, help="target schema version (default: the current)")
@click.option(
    "--max-assets",
    type=int,
    help="widen the policy to this many asset slots (new slots start masked)",
)
def checkpoint_migrate(run_dir: str, to_version: int | None, max_assets: int | None) -> None:
    """Upgrade a run directory to the current manifest schema, or widen it; backs it up first."""
    # heavy (pydantic models, torch): imported when the command runs, keeps --help instant
    from allocator.artifacts.manifest import SCHEMA_VERSION
    from allocator.trainer.checkpoints.errors import CheckpointUpgradeError
    from allocator.trainer.checkpoints.upgrade import upgrade_run

    with failing(CheckpointUpgradeError):
        result = upgrade_run(
            run_dir, SCHEMA_VERSION if to_version is None else to_version, max_assets
        )
    probe = result.probe
    click.echo(f"migrated {result.run_dir}: schema v{result.from_version} -> v{result.to_version}")
    click.echo(f"backup: {result.backup}")
    if result.widened_from is None:
        click.echo(
            f"probe: {probe.observations} observations, max |action diff| "
            f"{probe.float32_max_diff:g}"
        )
        return
    icm = probe.icm_canonical_max_diff
    click.echo(
        f"widened: max_assets {result.widened_from} -> {result.manifest.max_assets} "
        f"(new slots start masked; their action {probe.new_slot_max_action:g})"
    )
    click.echo(
        f"probe: {probe.observations} observations over {probe.masks} masks of the old slots; "
        f"canonical float64 max |diff| actor {probe.canonical_max_diff:g}, "
        f"critics {probe.critic_canonical_max_diff:g}"
        + (f", icm {icm:g}" if icm is not None else "")
        + f"; float32 predict max |diff| {probe.float32_max_diff:.3g}"
    )
