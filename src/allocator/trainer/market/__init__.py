"""Price data and walk-forward windows over it."""
