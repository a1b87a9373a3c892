"""Run directories as checkpoints: schema versions and their upgrade steps, widening to more
asset slots, and the probes proving that an upgrade changed no action (``upgrade`` runs them)."""
