"""A watching server heals and tells: a version copied in two steps (manifest first, model
seconds later) is refused, then served once complete with nobody touching its manifest; a
corrupted version is refused, counted and listed by ``ListModels``, while the previous version
keeps answering.

The server scans its registry on its own (``reload_interval`` 0.1 s); the test only copies
files and watches through gRPC and the server's metrics.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from allocator.serving.client import AllocatorClient, ModelRefusal
from tests.serving.conftest import write_tiny_model
from tests.serving.server.helpers import price_window, start_server, wait_for

ASSETS = ("A", "B", "C")


def test_a_two_step_copy_heals_and_a_corrupted_version_is_refused_counted_and_listed(
    tmp_path: Path,
) -> None:
    registry = tmp_path / "registry"
    write_tiny_model(registry / "tiny" / "1")
    source = write_tiny_model(tmp_path / "export")
    server = start_server(tmp_path / "server", registry, reload_interval=0.1)
    metrics = server.metrics_registry

    def refused_total(reason: str) -> float:
        labels = {"reason": reason}
        return metrics.get_sample_value("allocator_serving_model_refused_total", labels) or 0.0

    def answered_by() -> str:
        prices = price_window(len(ASSETS))
        return client.allocate("p", ASSETS, prices).model_version

    client = AllocatorClient(server.target)
    try:
        assert answered_by() == "1"

        # Step one of the copy: the manifest (and the ICM) land, model.onnx does not yet.
        target = registry / "tiny" / "2"
        target.mkdir()
        shutil.copy2(source / "manifest.json", target / "manifest.json")
        shutil.copy2(source / "icm.onnx", target / "icm.onnx")
        manifest_stat = os.stat(target / "manifest.json")
        wait_for(lambda: bool(client.refused_models()), "tiny/2 refused while half-copied")
        (refusal,) = client.refused_models()
        assert (refusal.name, refusal.version, refusal.reason) == ("tiny", "2", "missing_file")
        assert "model.onnx" in refusal.message
        assert answered_by() == "1"
        assert refused_total("missing_file") == 1.0

        # Step two, seconds later: the model arrives as rsync delivers a file (a temporary
        # name, then a rename); nothing touches the manifest.
        shutil.copy2(source / "model.onnx", target / ".model.onnx.Xy12Ab")
        os.rename(target / ".model.onnx.Xy12Ab", target / "model.onnx")
        wait_for(lambda: answered_by() == "2", "tiny/2 served once complete")
        assert client.refused_models() == []
        assert {m.version for m in client.list_models()} == {"1", "2"}
        after = os.stat(target / "manifest.json")
        assert (after.st_mtime_ns, after.st_size) == (
            manifest_stat.st_mtime_ns,
            manifest_stat.st_size,
        )
        assert refused_total("missing_file") == 1.0  # refused once, however many scans

        # A corrupted version 3 (one byte flipped after its manifest was written).
        staged = write_tiny_model(registry / "tiny" / ".tmp-3")
        data = bytearray((staged / "model.onnx").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (staged / "model.onnx").write_bytes(bytes(data))
        staged.rename(registry / "tiny" / "3")
        wait_for(lambda: bool(client.refused_models()), "tiny/3 refused")
        (refusal,) = client.refused_models()
        assert refusal == ModelRefusal("tiny", "3", "checksum_mismatch", refusal.message), refusal
        assert "model.onnx" in refusal.message
        assert "sha256" in refusal.message
        assert refused_total("checksum_mismatch") == 1.0
        gauge = metrics.get_sample_value(
            "allocator_serving_models_refused", {"reason": "checksum_mismatch"}
        )
        assert gauge == 1.0
        for _ in range(20):  # the previous version keeps serving
            assert answered_by() == "2"
        assert {m.version for m in client.list_models()} == {"1", "2"}
    finally:
        client.close()
        server.stop()
