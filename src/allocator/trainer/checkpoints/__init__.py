"""Run directories as checkpoints: schema upgrades and widening, proven by probes to change no
action."""
