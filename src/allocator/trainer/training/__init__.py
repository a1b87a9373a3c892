"""One training run: its typed config, the run itself, the files it writes (``run_dir``), audits
and callbacks."""
