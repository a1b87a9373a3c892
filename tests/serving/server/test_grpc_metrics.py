"""The standard gRPC server metrics on a real server, labelled by the version that answered."""

from __future__ import annotations

from pathlib import Path

import grpc

from allocator.serving.proto import SERVICE_NAME
from allocator.serving.proto.v1 import allocator_pb2 as pb
from tests.serving.server.helpers import OK, batch_of, connect, make_request, start_server

UNARY = {"grpc_type": "unary", "grpc_service": SERVICE_NAME}


def test_calls_are_counted_by_method_code_and_answering_version(
    tiny_registry: Path, tmp_path: Path
) -> None:
    server = start_server(tmp_path, tiny_registry)
    conn = connect(server)
    try:
        answer = conn.allocate(make_request("m1"))
        code, _, batch = conn.call(
            "AllocateBatch", batch_of(make_request("m2"), make_request("m3"))
        )
        assert code is OK
        missing, _, _ = conn.call("Allocate", make_request("m4", model="nosuch"))
        assert missing is grpc.StatusCode.NOT_FOUND
        listed, _, _ = conn.call("ListModels", pb.ListModelsRequest())
        assert listed is OK
        count = conn.counter
    finally:
        conn.channel.close()
        server.stop()

    model, version = answer.model.name, answer.model.version
    assert model  # the response names the version that answered
    assert version
    assert {(r.model.name, r.model.version) for r in batch.responses} == {(model, version)}
    allocate = {**UNARY, "grpc_method": "Allocate"}
    answered = {"model": model, "version": version}
    assert count("grpc_server_started_total", **allocate) == 2
    assert count("grpc_server_handled_total", **allocate, grpc_code="OK", **answered) == 1
    assert (
        count("grpc_server_handled_total", **allocate, grpc_code="NOT_FOUND", model="", version="")
        == 1
    )
    assert count("grpc_server_handling_seconds_count", **allocate, **answered) == 1
    assert count("grpc_server_msg_received_total", **allocate) == 2
    assert count("grpc_server_msg_sent_total", **allocate) == 1
    batched = {**UNARY, "grpc_method": "AllocateBatch"}
    assert count("grpc_server_handled_total", **batched, grpc_code="OK", **answered) == 1
    assert count("grpc_server_handling_seconds_count", **batched, **answered) == 1
    listing = {**UNARY, "grpc_method": "ListModels", "grpc_code": "OK", "model": "", "version": ""}
    assert count("grpc_server_handled_total", **listing) == 1
