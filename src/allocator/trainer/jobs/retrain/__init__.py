"""Scheduled retraining (``allocator retrain``): train on the latest window, judge the candidate on
held-out days never trained on, promote it or not.

The candidate is exported hidden (``REGISTRY/.candidates/NAME/VERSION``), so a rejected model is
never served; a promotion moves the production pointer inside the ``promotions`` row's
transaction. Versions name the held-out span's last date (``YYYYMMDD``, ``YYYYMMDD.N`` on a rerun):
numeric, so they order after ``allocator export``'s small integers."""
