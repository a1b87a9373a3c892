"""Learning algorithms (TD3, SAC), their networks, exploration noise, regularizers, curiosity."""
