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
