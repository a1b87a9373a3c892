"""Scheduled retraining: train on the latest window, judge the candidate, promote it or not.

What a CronJob runs (``allocator retrain --config configs/retrain.yaml``):

1. Spans, in trading days back from ``as_of`` (default: the data's last date): the most recent
   ``holdout_days`` are held out, ``purge_days`` separate them from the ``train_days`` trained
   on. Nothing held out is ever trained on (normalization included).
2. Train, export as a *candidate* into ``REGISTRY/.candidates/NAME/VERSION``: hidden from
   servers, so a rejected model is never served.
3. Backtest candidate and production (the pointer's version, else the newest) through the
   serving path on the held-out span, same assets and costs; equal weight for reference.
4. Gates (``GateSettings``), each with a reason. All pass: the candidate is renamed into
   ``REGISTRY/NAME/VERSION`` and the production pointer moved to it atomically. Any fails: the
   pointer is left alone.
5. The decision goes to the ``promotions`` table in the same transaction as the pointer move
   (a failed commit puts pointer and version back), and to a Pushgateway when configured.

Versions name the held-out span's last date, ``YYYYMMDD`` (``YYYYMMDD.N`` for a rerun on the
same data): numeric, so ``registry.naming.version_key`` orders them after ``allocator export``'s
small integers."""
