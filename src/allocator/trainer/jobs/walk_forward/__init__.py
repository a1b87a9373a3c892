"""Walk-forward validation: per window, train on its training span only, export, replay the exported
ONNX graph through the serving path on the unseen test span beside the baselines, and record.

A window is a pure function of its job (seeded per window, torch limited to ``torch_threads``), so
every executor gives identical metrics; on a cluster the registry and output folders are shared."""
