"""Scheduled retraining: train on the latest window, judge the candidate, promote it or not.

What a CronJob runs (``allocator retrain --config configs/retrain.yaml``):

1. Spans, counted in trading days back from ``as_of`` (default: the data's last date): the
   held-out span is the most recent ``holdout_days``; a purge gap of ``purge_days`` separates
   it from the ``train_days`` the candidate is trained on. Nothing in the held-out span is ever
   trained on (normalization included: training fits it on its own span).
2. Train with the trainer config, export the run to ONNX as a *candidate*, into
   ``REGISTRY/.candidates/NAME/VERSION``: hidden from servers, so a rejected model is never
   served, not even as "the newest version" of a registry without a production pointer.
3. Backtest the candidate and the production model (the production pointer's version, else the
   newest version) through the serving code path on the held-out span, same assets, same
   costs; equal weight beside them for reference.
4. Gates (``GateSettings``), each with a reason. All pass: the candidate directory is renamed
   into ``REGISTRY/NAME/VERSION`` and the production pointer moved to it, atomically, so a
   running server switches on its next scan. Any fails: the pointer is left alone.
5. The decision, its reasons and both models' metrics go to the ``promotions`` table (in the
   same transaction as the pointer move: if the record cannot be committed, the pointer and the
   version directory are put back), and to a Pushgateway when one is configured.

Versions name the held-out span's last date, ``YYYYMMDD`` (``YYYYMMDD.N`` for a second run on
the same data): numeric, so ``allocator.registry.naming.version_key`` orders them by date and
after the small integers ``allocator export`` gives by default.

Modules: ``config`` (the job's settings), ``spans`` (step 1), ``gates`` (step 4's rules),
``decision`` (what was decided, on what), ``record`` (step 5's database row and the promotion
it commits with), ``runner`` (``retrain``: the steps in order).
"""
