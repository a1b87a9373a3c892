"""Scheduled and batch jobs: walk-forward validation, retraining, hyperparameter tuning, the
market suite (one recipe judged on every generated market), evaluation and reports."""
