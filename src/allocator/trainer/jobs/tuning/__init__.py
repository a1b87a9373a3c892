"""Hyperparameter tuning: an Optuna study over trainer keys, scored on the inner span only.

Every trial trains the base trainer config with the values drawn for it and ``selection``
forced on: the training span is cut into the part the model learns from, a purge gap and an
inner span, and the trial's value is the best inner-span score its run reached. No trial
backtests the validation span or reads a price after ``data.train_end``, so a configuration
chosen here can be judged on later years (walk-forward test years, with ``best.yaml`` as the
trainer and ``tune.json``'s ``configurations_tried``) without having looked at them.

Modules, in the order a study uses them: ``config`` (what to run), ``space`` (the search space,
checked against the trainer config), ``study`` (the journal storage, sampler and pruner),
``pruning`` (the callback reporting inner scores), ``objective`` (one trial), ``results``
(trials.csv, best.yaml, tune.json), ``runner`` (``run_tuning``, on a local or Ray executor of
``jobs.executors``).
"""
