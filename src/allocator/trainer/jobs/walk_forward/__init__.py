"""Walk-forward validation: per window, train -> export -> backtest the export -> record.

Each window (``allocator.trainer.market.windows``) trains a fresh model on its training span
only (training fits the observation normalization there too), exports it to the registry as
version ``wf-<label>-w03``, replays the exported ONNX graph through the serving code path on
the unseen test span and backtests the baselines on the same span, assets and costs (fitted
baselines see only the training span by default). The trainer's own validation backtest is
pointed at the test span as a torch-path diagnostic; nothing is selected on it (no early
stopping, no checkpoint choice), so it cannot leak.

Windows run one after another in this process (``executor: local``), in worker processes
(``executor: processes``) or as Ray tasks (``executor: ray``: a local Ray when no address is
given, ``ray.init(address=...)`` otherwise; on a cluster the registry and output folders must be
on storage every node shares), by the executors every batch job uses
(``allocator.trainer.jobs.executors``). A window is a pure function of its job (seeded per
window, torch limited to ``torch_threads`` in every executor), so every executor gives identical
metrics.

Modules, in the order a run uses them: ``config`` (what to run), ``window`` (one window's job,
and whether its artifacts are whole), ``progress`` (a window's progress
file while it runs), ``results`` (what they produce), ``persist`` (each finished window kept in
the run directory), ``returns`` (every window's daily net returns, ``returns.csv``),
``significance`` (intervals and tests from them), ``summary`` (the figures over all windows),
``store`` (the database rows), ``report`` (``summary.json``, markdown and figures), ``state``
(the run's identity, ``walk_forward.json``), ``runner`` (``run_walk_forward``, the driver).
``resume`` finishes a run that was killed (``--resume``), ``status`` shows how far a run is, and
``rebuild`` backtests a baseline a finished run did not record.
"""
