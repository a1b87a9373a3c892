"""The simulated market: environment, rewards, backtests, baselines, performance."""
