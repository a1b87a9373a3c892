"""Offline side of Allocator: data, environment, rewards, backtests (and, later, training).

Submodules are imported explicitly; importing this package pulls in neither torch nor pandas.
"""
