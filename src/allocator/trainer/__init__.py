"""Offline side of Allocator: data, environment, rewards, backtests, agents, training,
export and the scheduled jobs.

Submodules are imported explicitly; importing this package pulls in neither torch nor pandas.
"""
