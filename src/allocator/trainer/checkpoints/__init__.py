"""Run directories as checkpoints: manifests, format upgrades, widening."""
