"""One training run: its typed config, the run itself, audits and callbacks."""
