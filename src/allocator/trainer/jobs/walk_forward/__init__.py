"""Walk-forward validation: per window, train -> export -> backtest the export -> record.

Each window (``allocator.trainer.market.windows``) trains a fresh model on its training span
only, exports it as registry version ``wf-<label>-w03``, replays the exported ONNX graph through
the serving path on the unseen test span, and backtests the baselines on the same span, assets
and costs (fitted baselines see only the training span by default). The trainer's validation
backtest runs on the test span as a torch-path diagnostic; nothing is selected on it, so it
cannot leak. A window is a pure function of its job (seeded per window, torch limited to
``torch_threads``), so every executor (``jobs.executors``: local, processes, Ray; on a cluster
the registry and output folders must be shared) gives identical metrics.

Modules: ``config``, ``window`` (one window's job), ``progress`` (per-window progress files and
``allocator walk-forward status``), ``rundir`` (the run directory's files), ``summary`` (with
the statistics), ``store`` (database rows), ``report``, ``html_report``, ``runner``
(``run_walk_forward``, ``resume_walk_forward``), ``seeds`` (seed luck apart from period luck)."""
