"""Learning algorithms: TD3, SAC (by name in ``algorithms``), what they share (``off_policy``),
their exploration noise, regularizer and curiosity."""
