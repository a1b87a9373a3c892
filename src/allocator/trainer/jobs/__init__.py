"""Scheduled and batch jobs: walk-forward validation, retraining, evaluation, reports."""
