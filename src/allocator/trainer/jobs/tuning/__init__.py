"""Hyperparameter tuning: an Optuna study over trainer keys, scored on the inner span only, so a
chosen configuration can be judged on later years it has never seen."""
