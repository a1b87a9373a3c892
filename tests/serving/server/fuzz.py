"""A seeded generator of hostile request bytes for every method the server offers.

Each case starts from a valid request of its method (built with the generated messages, as a
client from ``proto/`` would) and is then, most of the time, spoiled the way a broken client,
a proxy or a fuzzer spoils bytes: truncated, bit-flipped, overwritten, spliced with random
bytes or replaced by them; fields appended with strings that are not UTF-8, absurd lengths,
overlong varints, wrong wire types, deep groups, NaN and infinite doubles, 10,000-character or
NUL ids, ``cash`` as an asset. What still decodes exercises validation and the decision; what
does not exercises the decoding guard. The same seed gives the same cases.
"""

from __future__ import annotations

import itertools
import random
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from allocator.serving.proto import SERVICE_NAME
from allocator.serving.proto.v1 import allocator_pb2 as pb
from tests.serving.server.helpers import MAX_ASSETS, price_window
from tests.serving.server.wire import BAD_UTF8, length_delimited, tag, varint

ALLOCATE = f"/{SERVICE_NAME}/Allocate"
BATCH = f"/{SERVICE_NAME}/AllocateBatch"
STREAM = f"/{SERVICE_NAME}/AllocateStream"
"""Its cases are single messages of a stream (``Fuzzer.cases(n, (STREAM,))``)."""
LIST_MODELS = f"/{SERVICE_NAME}/ListModels"
RESET = f"/{SERVICE_NAME}/ResetPortfolio"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"

UNARY = (ALLOCATE, BATCH, LIST_MODELS, RESET, HEALTH_CHECK)
"""The unary methods, in the proportions the generator draws them (Allocate twice)."""

PORTFOLIOS = tuple(f"fz{i}" for i in range(8))
"""Every portfolio a valid case names; they all start "fz", apart from other tests' ones."""

_NASTY_DOUBLES = (
    float("nan"),
    float("inf"),
    float("-inf"),
    0.0,
    -0.0,
    -1.0,
    5e-324,
    1.7976931348623157e308,
)
_NASTY_IDS = ("x" * 10_000, "a\x00b", "\x00", "cash", "Cash", "CASH", " ", "€" * 201)


@dataclass(frozen=True, slots=True)
class Case:
    """One request: the method's full name, the bytes sent, and how they were made."""

    method: str
    data: bytes
    how: str


class Fuzzer:
    """Cases from a seed: ``cases(n, methods)`` draws ``n`` of them over ``methods``."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self._ids = itertools.count()
        self._valid: dict[str, Callable[[], bytes]] = {
            ALLOCATE: lambda: self.allocate_request().SerializeToString(),
            BATCH: self._batch,
            STREAM: self._stream_message,
            LIST_MODELS: lambda: b"",
            RESET: lambda: pb.ResetPortfolioRequest(
                portfolio_id=self.rng.choice(PORTFOLIOS)
            ).SerializeToString(),
            HEALTH_CHECK: self._health,
            HEALTH_WATCH: self._health,
            REFLECTION: self._reflection,
        }
        self._mutations: tuple[Callable[[str, bytes], bytes], ...] = (
            self._truncate,
            self._flip_bits,
            self._overwrite,
            self._insert,
            self._delete,
            self._random,
            self._bad_utf8,
            self._nasty_string,
            self._length_past_the_end,
            self._overlong_varint,
            self._deep_groups,
            self._wrong_wire_type,
            self._nasty_doubles,
            self._merge,
        )

    def valid(self, method: str) -> bytes:
        return self._valid[method]()

    def cases(self, n: int, methods: tuple[str, ...] = UNARY) -> Iterator[Case]:
        """``n`` cases: about one in six valid as built, the rest spoiled by one or two
        mutations (names joined with ``+``)."""
        for _ in range(n):
            method = self.rng.choice(methods)
            data = self.valid(method)
            if self.rng.random() < 1 / 6:
                yield Case(method, data, "valid")
                continue
            names = []
            for _ in range(1 if self.rng.random() < 0.8 else 2):
                mutate = self.rng.choice(self._mutations)
                data = mutate(method, data)
                names.append(getattr(mutate, "__name__", "mutation").strip("_"))
            yield Case(method, data, "+".join(names))

    # --- valid requests --------------------------------------------------------------------

    def allocate_request(self, portfolio_id: str | None = None) -> pb.AllocateRequest:
        rng = self.rng
        assets = rng.sample("ABCDE", rng.randint(1, MAX_ASSETS))
        request = pb.AllocateRequest(
            portfolio_id=portfolio_id or rng.choice(PORTFOLIOS),
            request_id=f"fz-{next(self._ids)}",
            asset_ids=assets,
            prices=price_window(len(assets), rng.randrange(1 << 16)).ravel().tolist(),
        )
        if rng.random() < 0.3:
            w = [rng.random() + 1e-3 for _ in range(len(assets) + 1)]
            request.current_weights.extend(x / sum(w) for x in w)
        pin = rng.choice([None, None, ("tiny", ""), ("plain", "1"), ("", "1")])
        if pin is not None:
            request.model.name, request.model.version = pin
        return request

    def _batch(self) -> bytes:
        ids = self.rng.sample(PORTFOLIOS, self.rng.randint(1, 3))
        batch = pb.AllocateBatchRequest(requests=[self.allocate_request(p) for p in ids])
        return batch.SerializeToString()

    def _stream_message(self) -> bytes:
        ids = self.rng.sample(PORTFOLIOS, self.rng.randint(1, 3))
        batch = pb.AllocateBatchRequest(requests=[self.allocate_request(p) for p in ids])
        message = pb.AllocateStreamRequest(sequence=self.rng.randrange(1 << 64), batch=batch)
        return message.SerializeToString()

    def _health(self) -> bytes:
        service = self.rng.choice(["", SERVICE_NAME, "no.such.Service"])
        return health_pb2.HealthCheckRequest(service=service).SerializeToString()

    def _reflection(self) -> bytes:
        which = self.rng.choice(["list", SERVICE_NAME, "no.such.Service"])
        if which == "list":
            return reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()
        return reflection_pb2.ServerReflectionRequest(
            file_containing_symbol=which
        ).SerializeToString()

    # --- mutations of bytes -----------------------------------------------------------------

    def _random(self, method: str, data: bytes) -> bytes:
        return self.rng.randbytes(self.rng.randrange(0, 64))

    def _merge(self, method: str, data: bytes) -> bytes:
        """Two messages back to back parse as one: repeated fields add up."""
        return data + self.valid(method)

    def _truncate(self, method: str, data: bytes) -> bytes:
        return data[: self.rng.randrange(len(data))] if data else b"\x0a"

    def _flip_bits(self, method: str, data: bytes) -> bytes:
        if not data:
            return bytes([1 << self.rng.randrange(8)])
        out = bytearray(data)
        for _ in range(self.rng.randint(1, 4)):
            out[self.rng.randrange(len(out))] ^= 1 << self.rng.randrange(8)
        return bytes(out)

    def _overwrite(self, method: str, data: bytes) -> bytes:
        out = bytearray(data or b"\x00")
        for _ in range(self.rng.randint(1, 4)):
            out[self.rng.randrange(len(out))] = self.rng.randrange(256)
        return bytes(out)

    def _insert(self, method: str, data: bytes) -> bytes:
        at = self.rng.randrange(len(data) + 1)
        return data[:at] + self.rng.randbytes(self.rng.randint(1, 8)) + data[at:]

    def _delete(self, method: str, data: bytes) -> bytes:
        if not data:
            return data
        at = self.rng.randrange(len(data))
        return data[:at] + data[at + self.rng.randint(1, 8) :]

    def _string_field(self, method: str, payload: bytes) -> bytes:
        """``payload`` as one of the method's string fields, nested where the field is."""
        if method in (ALLOCATE, BATCH, STREAM):
            where = self.rng.choice(["portfolio_id", "request_id", "asset", "model.name"])
            field = {"portfolio_id": 1, "request_id": 2, "asset": 3}.get(where)
            inner = (
                length_delimited(6, length_delimited(1, payload))
                if field is None
                else length_delimited(field, payload)
            )
            if method in (BATCH, STREAM):
                request = self.allocate_request().SerializeToString()
                return _in_batch(method, request + inner)
            return inner
        if method == REFLECTION:
            return length_delimited(self.rng.choice([1, 4, 7]), payload)
        return length_delimited(1, payload)  # ResetPortfolio, health; ListModels: unknown

    def _bad_utf8(self, method: str, data: bytes) -> bytes:
        bad = self.rng.choice(BAD_UTF8)
        at = self.rng.randint(0, 3)
        return data + self._string_field(method, b"fz"[:at] + bad + b"x"[: self.rng.randint(0, 1)])

    def _nasty_string(self, method: str, data: bytes) -> bytes:
        return data + self._string_field(method, self.rng.choice(_NASTY_IDS).encode())

    def _length_past_the_end(self, method: str, data: bytes) -> bytes:
        field = self.rng.randint(1, 8)
        length = self.rng.choice([5, 1000, 1 << 31, (1 << 64) - 1])
        return data + tag(field, 2) + varint(length) + b"ab"

    def _overlong_varint(self, method: str, data: bytes) -> bytes:
        return data + tag(self.rng.randint(1, 8), 0) + b"\xff" * self.rng.randint(9, 12) + b"\x01"

    def _deep_groups(self, method: str, data: bytes) -> bytes:
        depth = self.rng.choice([50, 101, 200, 5000])
        ends = tag(9, 4) * (depth if self.rng.random() < 0.5 else 0)
        return data + tag(9, 3) * depth + ends

    def _wrong_wire_type(self, method: str, data: bytes) -> bytes:
        return data + tag(self.rng.randint(0, 9), self.rng.randint(0, 7)) + self.rng.randbytes(9)

    def _nasty_doubles(self, method: str, data: bytes) -> bytes:
        values = [self.rng.choice(_NASTY_DOUBLES) for _ in range(self.rng.randint(1, 12))]
        if self.rng.random() < 0.3:
            values.append(struct.unpack("<d", self.rng.randbytes(8))[0])  # any bit pattern
        packed = length_delimited(self.rng.choice([4, 5]), struct.pack(f"<{len(values)}d", *values))
        if method in (BATCH, STREAM):
            return data + _in_batch(method, self.allocate_request().SerializeToString() + packed)
        return data + packed


def _in_batch(method: str, request: bytes) -> bytes:
    """``request`` (an AllocateRequest's bytes) as one item of the method's batch."""
    item = length_delimited(1, request)  # AllocateBatchRequest.requests
    return item if method == BATCH else length_delimited(2, item)  # AllocateStreamRequest.batch
