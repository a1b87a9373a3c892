"""The floor under ``allocator serve``: grpcio + onnxruntime doing nothing but the model call.

``bench/serve_latency.py`` runs this beside Allocator in the same sitting, against the same
``model.onnx``, so its ratios say how much of a call is Allocator's own work (validation,
features, the anchor and tilt, EMA state, recording) and how much is gRPC and the model,
whatever the machine. It answers ``Allocate``, ``AllocateBatch`` and ``AllocateStream`` (each
message's batch as it arrives) from the generated stubs: closes to log returns, padded or cut
to the graph's input width, one ``session.run``, the graph's weights (or its action) as the
response. No validation, no state, no recording, no
metrics: a correct server cannot be faster than this on the same stack.

``--aio`` serves the same handlers on ``grpc.aio`` and uvloop, answering on the event loop's
thread as ``allocator serve`` does, so the pair says what the asyncio server costs by itself.

Run: ``python bench/bare_server.py --model REGISTRY/NAME/VERSION/model.onnx --port 50051``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort

from allocator.serving.proto.v1 import allocator_pb2 as pb
from allocator.serving.proto.v1 import allocator_pb2_grpc as pb_grpc


class BareAllocator(pb_grpc.AllocatorServicer):
    """Prices in, one ONNX call, weights out: the least a policy server must do."""

    def __init__(self, model: Path) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        inputs = self.session.get_inputs()
        self.names = [i.name for i in inputs]
        self.shared = len(inputs[0].shape) == 3  # (batch, assets, features): a set graph
        self.width = int(inputs[0].shape[-1])
        self.n_slots = None if self.shared else int(inputs[1].shape[-1])
        self.output = self.session.get_outputs()[-1].name  # flat: weights; shared: action

    def _feeds(self, requests: list[pb.AllocateRequest]) -> tuple[dict[str, Any], int]:
        n = max(len(r.asset_ids) for r in requests)
        slots = n + 1 if self.shared else self.n_slots
        assert slots is not None
        batch = len(requests)
        first = np.zeros((batch, n, self.width) if self.shared else (batch, self.width), np.float32)
        for b, r in enumerate(requests):
            closes = np.asarray(r.prices, dtype=np.float64).reshape(len(r.asset_ids), -1)
            returns = np.diff(np.log(closes), axis=1).astype(np.float32)
            if self.shared:
                k = min(self.width, returns.shape[1])
                first[b, : returns.shape[0], :k] = returns[:, -k:]
            else:
                flat = returns.ravel()[: self.width]
                first[b, : flat.size] = flat
        mask = np.ones((batch, slots), np.float32)
        feeds = {self.names[0]: first, self.names[-1]: mask}
        if self.shared:
            feeds[self.names[1]] = np.full((batch, slots), 1.0 / slots, np.float32)
        return feeds, slots

    def answer(self, requests: list[pb.AllocateRequest]) -> list[pb.AllocateResponse]:
        feeds, _ = self._feeds(requests)
        (out,) = self.session.run([self.output], feeds)
        responses = []
        for b, r in enumerate(requests):
            w = out[b, : len(r.asset_ids) + 1].astype(np.float64)
            weights = w.tolist()
            responses.append(
                pb.AllocateResponse(
                    request_id=r.request_id,
                    portfolio_id=r.portfolio_id,
                    asset_ids=["CASH", *r.asset_ids],
                    raw_weights=weights,
                    smoothed_weights=weights,
                )
            )
        return responses

    def Allocate(  # noqa: N802  (the generated servicer's name)
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        return self.answer([request])[0]

    def AllocateBatch(  # noqa: N802
        self, request: pb.AllocateBatchRequest, context: grpc.ServicerContext
    ) -> pb.AllocateBatchResponse:
        return pb.AllocateBatchResponse(responses=self.answer(list(request.requests)))

    def AllocateStream(  # noqa: N802
        self, request_iterator: Iterator[pb.AllocateStreamRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.AllocateStreamResponse]:
        for message in request_iterator:
            yield pb.AllocateStreamResponse(
                sequence=message.sequence, responses=self.answer(list(message.batch.requests))
            )


class AsyncBareAllocator(pb_grpc.AllocatorServicer):
    """The same answers from coroutines on the event loop's thread (no handler threads)."""

    def __init__(self, bare: BareAllocator) -> None:
        self.bare = bare

    async def Allocate(  # noqa: N802
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateResponse:
        return self.bare.answer([request])[0]

    async def AllocateBatch(  # noqa: N802
        self, request: pb.AllocateBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateBatchResponse:
        return pb.AllocateBatchResponse(responses=self.bare.answer(list(request.requests)))

    async def AllocateStream(  # noqa: N802
        self,
        request_iterator: AsyncIterator[pb.AllocateStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.AllocateStreamResponse]:
        async for message in request_iterator:
            responses = self.bare.answer(list(message.batch.requests))
            yield pb.AllocateStreamResponse(sequence=message.sequence, responses=responses)


OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
]
"""The same message limits as the load generator."""


async def serve_aio(model: Path, port: int) -> None:
    """Serve on ``grpc.aio`` until SIGTERM or SIGINT."""
    server = grpc.aio.server(options=OPTIONS)
    pb_grpc.add_AllocatorServicer_to_server(AsyncBareAllocator(BareAllocator(model)), server)
    if server.add_insecure_port(f"127.0.0.1:{port}") == 0:
        raise SystemExit(f"cannot bind 127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("SERVING", flush=True)
    await stop.wait()
    await server.stop(grace=1)


def serve(model: Path, port: int, threads: int = 16) -> None:
    """Serve until SIGTERM or SIGINT on a pool of handler threads."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), options=OPTIONS)
    pb_grpc.add_AllocatorServicer_to_server(BareAllocator(model), server)
    if server.add_insecure_port(f"127.0.0.1:{port}") == 0:
        raise SystemExit(f"cannot bind 127.0.0.1:{port}")
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print("SERVING", flush=True)
    stop.wait()
    server.stop(grace=1).wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a model.onnx")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=16, help="handler threads")
    parser.add_argument("--aio", action="store_true", help="grpc.aio on uvloop, no threads")
    args = parser.parse_args()
    if args.aio:
        import uvloop  # the serve extra's event loop, as allocator serve runs it

        uvloop.run(serve_aio(args.model, args.port))
    else:
        serve(args.model, args.port, args.threads)


if __name__ == "__main__":
    main()
