"""Per-portfolio decision state, in memory (one process) or in Redis (replicas sharing the load).

Read state -> decide -> write state must be atomic per portfolio, so both stores hand out a
*locked session* for a set of portfolios: ``with store.locked(ids) as session``, then
``session.get()`` (None for a new portfolio) and ``session.put(new_states)``, which writes and
releases the locks.

Redis: a Lua script takes every lock of a batch at once and reads the states (one round trip);
a second writes only if every lock is still ours, and releases (one round trip). Not
WATCH/MULTI (a conflict would re-run the model) nor redis-py's ``Lock`` (two round trips per
portfolio). All-or-nothing acquisition means a waiting caller holds nothing: no deadlock; it
backs off until ``lock_wait_seconds``. A lock names its owner, whose liveness key a heartbeat
keeps alive: a lock whose owner's key is gone (a killed replica) is free within
``liveness_seconds``; ``lock_ttl_seconds`` bounds an owner alive but stuck. The token check at
write time is the fence: a replica whose lock was lost writes nothing (``StateLockLostError``).
The script reads keys not passed in ``KEYS``, so a call's keys must live on one Redis node (not
Cluster).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeAlias

import redis

from allocator.serving.portfolio_state import PortfolioState, StateDecodeError

logger = logging.getLogger("allocator.serving")

__all__ = [
    "MemoryStateStore",
    "RedisStateStore",
    "StateLockLostError",
    "StateLockTimeoutError",
    "StateSession",
    "StateStore",
]


class StateLockTimeoutError(TimeoutError):
    """A portfolio stayed locked by another decision for longer than the store waits."""


class StateLockLostError(RuntimeError):
    """A lock expired before the write; nothing was written (another replica may own it now)."""


def _unique_ids(portfolio_ids: Sequence[str]) -> tuple[str, ...]:
    ids = tuple(portfolio_ids)
    if len(set(ids)) != len(ids):
        raise ValueError("a locked session names each portfolio once")
    for pid in ids:
        if not isinstance(pid, str) or not pid:
            raise ValueError(f"portfolio id must be a non-empty string, got {pid!r}")
    return ids


@dataclass(eq=False)
class StateSession:
    """Locked access to some portfolios' states, as read under the locks; ``put`` at most once,
    inside the ``with``."""

    ids: tuple[str, ...]
    states: list[PortfolioState | None]
    write: Callable[[Sequence[PortfolioState | None]], None]
    done: bool = False

    def get(self) -> list[PortfolioState | None]:
        return list(self.states)

    def put(self, states: Sequence[PortfolioState | None]) -> None:
        """New states in the locked ids' order (``None`` deletes); releases the locks."""
        if self.done:
            raise RuntimeError("session.put was already called; a session writes once")
        if len(states) != len(self.ids):
            raise ValueError(f"{len(states)} states for {len(self.ids)} portfolios")
        self.done = True
        self.write(states)


def _release(held: list[threading.Lock]) -> None:
    """Release in reverse order of taking (a plain list: the request path's cheapest form)."""
    for lock in reversed(held):
        lock.release()


class MemoryStateStore:
    """States in a dict, one process, under striped locks (bounded memory, no per-portfolio lock
    lifecycle); a batch takes its stripes in index order, so batches cannot deadlock."""

    STRIPES = 4096
    LOCK_WAIT_SECONDS = 30.0

    def __init__(self) -> None:
        self._states: dict[str, PortfolioState] = {}
        self._locks = [threading.Lock() for _ in range(self.STRIPES)]

    def locked(self, portfolio_ids: Sequence[str]) -> AbstractContextManager[StateSession]:
        locked = self.try_locked(portfolio_ids, self.LOCK_WAIT_SECONDS)
        if locked is None:
            wait = self.LOCK_WAIT_SECONDS
            raise StateLockTimeoutError(f"portfolio state locked for more than {wait:g} s")
        return locked

    def try_locked(
        self, portfolio_ids: Sequence[str], timeout: float = 0.0
    ) -> AbstractContextManager[StateSession] | None:
        """``locked`` once every stripe is taken, in index order, within ``timeout``, else None
        holding none (0, the default: an event loop must not wait)."""
        ids = _unique_ids(portfolio_ids)
        held: list[threading.Lock] = []
        for k in sorted({hash(pid) % self.STRIPES for pid in ids}):
            if not self._locks[k].acquire(timeout=timeout):
                _release(held)
                return None
            held.append(self._locks[k])
        return self._session(ids, held)

    @contextmanager
    def _session(self, ids: tuple[str, ...], held: list[threading.Lock]) -> Iterator[StateSession]:
        def write(states: Sequence[PortfolioState | None]) -> None:
            for pid, state in zip(ids, states, strict=True):
                if state is None:
                    self._states.pop(pid, None)
                else:
                    self._states[pid] = state

        try:
            yield StateSession(ids, [self._states.get(pid) for pid in ids], write)
        finally:
            _release(held)

    def reset(self, portfolio_id: str) -> bool:
        """Forget a portfolio's state (under its lock); True if there was one."""
        with self.locked([portfolio_id]) as session:
            existed = session.get()[0] is not None
            session.put([None])
        return existed

    def close(self) -> None:
        self._states.clear()


# KEYS = n lock keys, then n state keys; ARGV = lock value (owner id ":" token), lock ttl (ms),
# n, owner prefix, our liveness key, liveness ttl (ms). Refreshes our liveness key first (a lock
# of ours is never without it). A lock is free when absent or when its owner's liveness key is
# gone (the owner died). All free: take them all and return {1 + locks taken over from dead
# owners, state_1, ..., state_n} (false = no state). Any lock held by a live owner: take none,
# return 0.
_ACQUIRE = """
local n = tonumber(ARGV[3])
redis.call('SET', ARGV[5], '1', 'PX', ARGV[6])
local dead = 0
for i = 1, n do
  local held = redis.call('GET', KEYS[i])
  if held then
    local owner = string.match(held, '^([^:]+):')
    if owner and redis.call('EXISTS', ARGV[4] .. owner) == 0 then
      dead = dead + 1
    else
      return 0
    end
  end
end
local out = {1 + dead}
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
  out[i + 1] = redis.call('GET', KEYS[n + i])
end
return out
"""

# KEYS as above; ARGV = token, n, ops (one char per portfolio: W write, D delete, K keep),
# then n values. Writes only when every lock is still ours; always releases the locks that
# are. Returns the number of locks found lost (0 = written).
_RELEASE = """
local n = tonumber(ARGV[2])
local ops = ARGV[3]
local lost = 0
for i = 1, n do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then lost = lost + 1 end
end
if lost == 0 then
  for i = 1, n do
    local op = string.sub(ops, i, i)
    if op == 'W' then
      redis.call('SET', KEYS[n + i], ARGV[3 + i])
    elseif op == 'D' then
      redis.call('DEL', KEYS[n + i])
    end
  end
end
for i = 1, n do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]) end
end
return lost
"""

_BACKOFF_START = 0.0002
_BACKOFF_MAX = 0.005


class RedisStateStore:
    """States in Redis as ``PortfolioState.to_bytes``, under ``prefix + portfolio_id``, shared by
    server replicas."""

    def __init__(
        self,
        url: str,
        prefix: str = "allocator:state:",
        *,
        lock_ttl_seconds: float = 10.0,
        lock_wait_seconds: float = 5.0,
        liveness_seconds: float = 0.5,
    ) -> None:
        self.prefix = prefix
        self.lock_prefix = "lock:" + prefix
        self.owner_prefix = "owner:" + prefix
        for other in (self.lock_prefix, self.owner_prefix):  # never each other's: l... vs o...
            if other.startswith(prefix):
                raise ValueError(f"key prefixes {prefix!r} and {other!r} must not overlap")
        if not lock_ttl_seconds > 0 or not lock_wait_seconds >= 0:
            raise ValueError("lock_ttl_seconds must be > 0 and lock_wait_seconds >= 0")
        if not liveness_seconds > 0:
            raise ValueError(f"liveness_seconds must be > 0, got {liveness_seconds}")
        self.owner = os.urandom(8).hex()
        self._client = redis.Redis.from_url(url)
        self._lock_ttl_ms = max(1, round(lock_ttl_seconds * 1000))
        self._liveness_ms = max(1, round(liveness_seconds * 1000))
        self._wait = lock_wait_seconds
        self._acquire_script = self._client.register_script(_ACQUIRE)
        self._release_script = self._client.register_script(_RELEASE)
        self._closed = threading.Event()
        self._heartbeat = threading.Thread(
            target=self._beat,
            args=(liveness_seconds / 4,),
            name="allocator-state-heartbeat",
            daemon=True,
        )
        self._heartbeat.start()

    @property
    def owner_key(self) -> str:
        return self.owner_prefix + self.owner

    def _beat(self, interval: float) -> None:
        while not self._closed.wait(interval):
            try:
                self._client.set(self.owner_key, b"1", px=self._liveness_ms)
            except redis.RedisError as exc:
                logger.debug("state store heartbeat failed: %s", exc)

    def _acquire(self, ids: tuple[str, ...]) -> tuple[list[str], str, list[Any]]:
        keys = [self.lock_prefix + pid for pid in ids] + [self.prefix + pid for pid in ids]
        token = f"{self.owner}:{os.urandom(12).hex()}"
        args: list[str | int] = [
            token,
            self._lock_ttl_ms,
            len(ids),
            self.owner_prefix,
            self.owner_key,
            self._liveness_ms,
        ]
        deadline = time.monotonic() + self._wait
        delay = _BACKOFF_START
        while True:
            reply = self._acquire_script(keys=keys, args=args)
            if reply != 0:
                if reply[0] > 1:
                    logger.warning(
                        "took over %d portfolio lock(s) of a state store that stopped (first %r)",
                        reply[0] - 1,
                        ids[0],
                    )
                return keys, token, reply[1:]
            if time.monotonic() >= deadline:
                raise StateLockTimeoutError(
                    f"portfolio state locked for more than {self._wait:g} s "
                    f"({len(ids)} portfolio(s), first {ids[0]!r})"
                )
            time.sleep(delay * (0.5 + random.random()))
            delay = min(2 * delay, _BACKOFF_MAX)

    def _release(self, keys: list[str], token: str, ops: str, values: list[bytes]) -> None:
        lost = self._release_script(keys=keys, args=[token, len(ops), ops, *values])
        if lost:
            raise StateLockLostError(
                f"{lost} portfolio lock(s) expired before the write (held longer than the "
                "lock ttl); no state was written"
            )

    @contextmanager
    def locked(self, portfolio_ids: Sequence[str]) -> Iterator[StateSession]:
        ids = _unique_ids(portfolio_ids)
        if not ids:
            yield StateSession(ids, [], lambda states: None)
            return
        keys, token, raw = self._acquire(ids)

        def write(states: Sequence[PortfolioState | None]) -> None:
            ops = "".join("D" if s is None else "W" for s in states)
            values = [b"" if s is None else s.to_bytes() for s in states]
            self._release(keys, token, ops, values)

        session = None
        try:
            session = StateSession(
                ids, [self._decode(p, b) for p, b in zip(ids, raw, strict=True)], write
            )
            yield session
        finally:
            if session is None or not session.done:
                self._release(keys, token, "K" * len(ids), [])

    def _decode(self, portfolio_id: str, data: bytes | None) -> PortfolioState | None:
        """An unreadable state restarts the portfolio rather than wedging it."""
        if data is None:
            return None
        try:
            return PortfolioState.from_bytes(data)
        except StateDecodeError as exc:
            logger.warning(
                "%s: unreadable portfolio state (%s); starting it again",
                self.prefix + portfolio_id,
                exc,
            )
            return None

    def reset(self, portfolio_id: str) -> bool:
        keys, token, raw = self._acquire(_unique_ids([portfolio_id]))
        self._release(keys, token, "D", [b""])
        return raw[0] is not None

    def close(self) -> None:
        """Drop the liveness key: any lock still held here is free."""
        self._closed.set()
        self._heartbeat.join()
        try:
            self._client.delete(self.owner_key)
        except redis.RedisError as exc:
            logger.debug("state store: liveness key not deleted (%s); it expires", exc)
        self._client.close()


StateStore: TypeAlias = MemoryStateStore | RedisStateStore
"""Where portfolio states live; see the module docstring for the locking contract."""
