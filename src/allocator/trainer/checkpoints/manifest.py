"""A checkpoint's manifest for people: what ``allocator checkpoint inspect`` prints."""

from __future__ import annotations

from allocator.artifacts.manifest import Manifest
from allocator.trainer.training.selection import LOGGED


def describe(manifest: Manifest) -> str:
    """A readable summary of a manifest for ``allocator checkpoint inspect``."""
    m = manifest
    lines = [
        f"schema version  {m.schema_version}",
        f"name            {m.name}",
        f"created         {m.created}",
        f"algorithm       {m.algorithm}",
        f"policy          {m.policy.kind}"
        + (f" (hidden {m.policy.hidden})" if m.policy.hidden is not None else "")
        + (f", serves up to {m.max_served_assets} assets" if m.policy.kind == "shared" else ""),
        f"max_assets      {m.feature_spec.max_assets} (window {m.feature_spec.window}, "
        f"features {', '.join(m.feature_spec.features)}, clip {m.feature_spec.clip})",
        f"feature set     {m.feature_spec.kind}"
        + (
            f" v{m.feature_spec.version}, horizons {m.feature_spec.horizons}, vol_window "
            f"{m.feature_spec.vol_window}, {m.feature_spec.n_features} features per asset"
            if m.feature_spec.kind == "asset_v1"
            else ""
        ),
        f"normalization   mean {m.normalization.mean:.6g}, std {m.normalization.std:.6g}"
        + (" (per-asset features: feature_normalization)" if m.feature_normalization else ""),
        f"action mapping  {m.action_mapping}"
        + (
            f" (k {m.tilt.k}, anchor {m.tilt.anchor.kind}, cash {m.tilt.anchor.cash_share}, "
            f"vol_window {m.tilt.anchor.vol_window})"
            if m.tilt is not None
            else ""
        ),
        f"smoothing beta  {m.beta}",
        f"costs           {m.cost_bps} bps",
        f"reward          {m.reward.get('kind', '?')} (scale {m.reward.get('scale', 1.0)})",
        f"data            {m.data.dataset}: train {m.data.train_start} .. {m.data.train_end}, "
        f"validation {m.data.validation_start} .. {m.data.validation_end}",
        f"universe        {', '.join(m.data.universe)}",
        f"seed            {m.seed}",
        f"icm             {'yes' if m.icm else 'no'}",
    ]
    if m.widened_from is not None:
        lines.append(f"widened from    {m.widened_from} assets")
    for name, values in (m.metrics or {}).items():
        if isinstance(values, dict):
            figures = ", ".join(
                f"{k} {v:.4g}"
                for k, v in values.items()
                if k in LOGGED and isinstance(v, (int, float))
            )
            lines.append(f"metrics         {name}: {figures}")
    if m.export:
        lines.append(f"export          {m.export}")
    for rec in m.migrations:
        lines.append(
            f"migration       v{rec.from_version} -> v{rec.to_version} at {rec.at} {rec.note}"
        )
    lines.append("files")
    lines.extend(f"  {name:<20} sha256 {digest}" for name, digest in m.files.items())
    lines.append("libraries       " + ", ".join(f"{k} {v}" for k, v in m.library_versions.items()))
    return "\n".join(lines)
