"""One training run: its config, the run itself, the files it writes, audits and callbacks."""
