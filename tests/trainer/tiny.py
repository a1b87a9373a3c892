"""The smallest training run that still exercises every part: a few hundred steps, tiny nets.

Tests that train (export, evaluation) share it so their runs stay comparable and cheap.
"""

TINY_TRAINING = [
    "env.window=10",
    "env.episode_length=60",
    "total_timesteps=300",
    "algorithm.learning_starts=100",
    "algorithm.batch_size=32",
    "algorithm.net_arch=[32,32]",
    "progress_bar=false",
    "tensorboard=false",
    "torch_threads=1",
]

TINY_SHARED = [
    "policy=shared",
    "shared.hidden=16",
    "env.features=asset_v1",
    "env.horizons=[5,10]",
    "env.vol_window=10",
    "env.action.mapping=tilt",
    "env.action.k=2.0",
    "env.action.anchor.kind=inverse_volatility",
    "env.action.anchor.vol_window=10",
]
"""The new representation at its smallest: shared networks, per-asset features, tilt of an
inverse-volatility anchor whose window matches the features' (so tiny spans suffice)."""
