"""The images: Dockerfiles parsed by BuildKit's parser (the ``dockerfile`` package; the
serving image installs the ``serve`` extra and no torch, COPY sources exist and pass
.dockerignore), and the health check script against a real gRPC health server, plaintext,
TLS and mTLS.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from concurrent import futures
from pathlib import Path
from types import ModuleType

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from allocator.serving.server import SERVICE_NAME
from tests.deploy.helpers import (
    DEPLOY,
    INSTRUCTIONS,
    ROOT,
    copies,
    dockerignore_allows,
    instructions,
    load_module,
    parse_cli,
    pip_installs,
    server_config,
)


@pytest.mark.parametrize("name", ["serve.Dockerfile", "train.Dockerfile"])
def test_dockerfiles_parse_copy_existing_files_and_drop_root(name):
    commands = instructions(name)
    assert {c.cmd for c in commands} <= INSTRUCTIONS
    base = next(c for c in commands if c.cmd == "FROM").value[0]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    python = base.split(":")[1].split("-")[0]  # python:3.11-slim -> 3.11
    assert base.startswith("python:")
    assert f">={python}" in requires
    for command in commands:
        if command.cmd == "COPY":
            assert not any(f.startswith("--from") for f in command.flags)
            for source in command.value[:-1]:
                assert (ROOT / source).exists(), f"{name}: COPY {source}: no such file"
                assert dockerignore_allows(source), f"{name}: .dockerignore excludes {source}"
    user = [c for c in commands if c.cmd == "USER"][-1].value[0]
    assert user.split(":")[0] not in {"root", "0"}
    # The build context stays small: the virtualenv, runs and models never go in.
    for excluded in (".venv/bin/python", "runs/x", "models/x/1", ".git/HEAD", "allocator.db"):
        assert not dockerignore_allows(excluded), excluded


def test_serve_image_installs_the_serve_extra_and_never_torch():
    installs = pip_installs("serve.Dockerfile")
    assert installs == [["--constraint", "requirements.lock", ".[serve]"]]
    assert any("requirements.lock" in c.value for c in copies("serve.Dockerfile"))
    runs = " ".join(" ".join(c.value) for c in instructions("serve.Dockerfile") if c.cmd == "RUN")
    assert "! pip show torch" in runs, "the build fails if torch sneaks in"
    assert "torch" not in runs.replace("! pip show torch", "")
    commands = instructions("serve.Dockerfile")
    entrypoint = next(c for c in commands if c.cmd == "ENTRYPOINT")
    cmd = next(c for c in commands if c.cmd == "CMD")
    assert entrypoint.json
    assert list(entrypoint.value) == ["allocator", "serve"]
    command, params = parse_cli([*entrypoint.value, *cmd.value])
    assert command == "serve"
    assert server_config(params).host == "0.0.0.0"
    healthcheck = next(c for c in commands if c.cmd == "HEALTHCHECK")
    script = Path(healthcheck.value[-1])
    assert script.relative_to("/app") in {Path(c.value[-1]) for c in copies("serve.Dockerfile")}


def test_train_image_installs_the_pinned_cpu_torch_then_the_train_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pin = next(d for d in extras["train"] if d.startswith("torch=="))
    installs = pip_installs("train.Dockerfile")
    torch_install = next(i for i in installs if pin in i)
    assert torch_install[torch_install.index("--index-url") + 1] == (
        "https://download.pytorch.org/whl/cpu"
    )
    args = {
        c.value[0].split("=")[0]: c.value[0]
        for c in instructions("train.Dockerfile")
        if c.cmd == "ARG"
    }
    assert args["EXTRAS"] == "EXTRAS=train,ray,tune,tensorboard"
    locked = ["--constraint", "requirements.lock", ".[${EXTRAS}]"]
    assert locked in installs
    assert installs.index(torch_install) < installs.index(locked)


# --- health check script -------------------------------------------------------------------

HEALTHCHECK = DEPLOY / "docker/healthcheck.py"


@pytest.fixture(scope="module")
def healthcheck() -> ModuleType:
    return load_module(HEALTHCHECK)


def health_server(credentials: grpc.ServerCredentials | None = None):
    server = grpc.server(futures.ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    address = "127.0.0.1:0"
    port = (
        server.add_secure_port(address, credentials)
        if credentials
        else server.add_insecure_port(address)
    )
    server.start()
    return server, servicer, f"127.0.0.1:{port}"


def test_healthcheck_reports_the_servers_health(healthcheck):
    assert healthcheck.SERVICE == SERVICE_NAME
    server, servicer, target = health_server()
    try:
        servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        assert healthcheck.main(["--target", target]) == 0
        # As Docker runs it: a process, settings from the environment.
        run = subprocess.run(
            [sys.executable, str(HEALTHCHECK)],
            env={"ALLOCATOR_HEALTH_TARGET": target, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert "SERVING" in run.stdout
        assert healthcheck.main(["--target", target, "--service", "other.Service"]) == 1
        servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)  # draining
        assert healthcheck.main(["--target", target]) == 1
    finally:
        server.stop(None)
    assert healthcheck.main(["--target", target, "--timeout", "0.5"]) == 1  # nothing listens


def test_healthcheck_over_tls_and_mtls(healthcheck, tmp_path):
    from tests.serving.certs import have_openssl, make_pki

    if not have_openssl():
        pytest.skip("openssl not installed")
    pki = make_pki(tmp_path / "pki")
    tls = grpc.ssl_server_credentials([(pki.read("server.key"), pki.read("server.pem"))])
    server, servicer, target = health_server(tls)
    try:
        servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        ca = str(pki.path("ca.pem"))
        assert healthcheck.main(["--target", target, "--ca", ca]) == 0
        assert healthcheck.main(["--target", target, "--ca", ca, "--server-name", "localhost"]) == 0
        assert healthcheck.main(["--target", target, "--timeout", "1"]) == 1  # plaintext
        wrong_ca = str(pki.path("client-ca.pem"))
        assert healthcheck.main(["--target", target, "--ca", wrong_ca, "--timeout", "1"]) == 1
    finally:
        server.stop(None)

    mtls = grpc.ssl_server_credentials(
        [(pki.read("server.key"), pki.read("server.pem"))],
        root_certificates=pki.read("client-ca.pem"),
        require_client_auth=True,
    )
    server, servicer, target = health_server(mtls)
    try:
        servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        client = ["--cert", str(pki.path("client.pem")), "--key", str(pki.path("client.key"))]
        assert healthcheck.main(["--target", target, "--ca", ca, *client]) == 0
        assert healthcheck.main(["--target", target, "--ca", ca, "--timeout", "1"]) == 1
    finally:
        server.stop(None)
