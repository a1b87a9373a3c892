"""Hyperparameter tuning: an Optuna study over trainer keys, scored on the inner span only.

Every trial trains the base trainer config with its drawn values and ``selection`` forced on;
its value is the best inner-span score its run reached. No trial backtests the validation span
or reads a price after ``data.train_end``, so a chosen configuration (``best.yaml``, with
``tune.json``'s ``configurations_tried``) can be judged on later years without having seen them."""
