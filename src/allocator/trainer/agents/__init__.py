"""Learning algorithms: TD3, SAC, their exploration noise, regularizer and curiosity."""
