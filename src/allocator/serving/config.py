"""What ``allocator serve`` takes: one strict settings model, read by the server factory.

``load_server_config`` fills it from, highest first: the command's flags, ``ALLOCATOR_<FIELD>``
environment variables, a YAML file, the defaults; ``database_url`` left unset everywhere still
falls back to ``DATABASE_URL``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from allocator.typed_config import ENV_PREFIX, ConfigError, StrictModel

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["ServerConfig", "ServerSettings", "load_server_config"]


class ServerConfig(StrictModel):
    """Everything ``allocator serve`` takes; the factory and tests build it directly."""

    registry: Path = Field(description="model registry directory (REGISTRY/NAME/VERSION)")
    host: str = Field("127.0.0.1", description="address to bind ([::] for every interface)")
    port: int = Field(50051, ge=0, le=65535, description="gRPC port (0: any free port)")
    metrics_port: int | None = Field(
        9464, ge=0, le=65535, description="Prometheus /metrics port (None: not exposed)"
    )
    database_url: str | None = Field(
        None, description="trade database (None: DATABASE_URL, else sqlite:///allocator.db)"
    )
    record: bool = Field(True, description="record every decision (off only for experiments)")
    spool_dir: Path = Field(Path("spool"), description="the recorder's durable spool")
    spool_quota_bytes: int = Field(1 << 30, ge=1, description="spool size that closes the door")
    ack: Literal["durable", "queued"] = Field(
        "durable",
        description="when OK is answered: once the decision is committed or fsync'd to the spool "
        "(durable), or once it is queued in memory (queued: faster; a crash loses the last "
        "~20 ms of answered decisions)",
    )
    batch_window_ms: float = Field(
        0.2,
        ge=0,
        le=100,
        description="decisions arriving this close share one onnxruntime call per model and one "
        "durable commit (the batch waits this long after its first call, while other calls "
        "are in flight)",
    )
    batch_max_decisions: int = Field(
        256, ge=1, description="decisions that close a batch before its window ends"
    )
    redis_url: str | None = Field(None, description="share smoothing state through Redis")
    auth_token_file: Path | None = Field(None, description="require this bearer token")
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = Field(None, description="require client certificates (mTLS)")
    latency_budget_ms: float = Field(10.0, gt=0, description="P95 budget per decision (alerts)")
    max_concurrent_rpcs: int = Field(64, ge=1, description="beyond it: RESOURCE_EXHAUSTED")
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop",
        description="the loop every call is answered on: uvloop (libuv; faster under "
        "concurrent calls) or the standard library's asyncio",
    )
    threads: int = Field(
        8,
        ge=1,
        description="threads per process for the state store's blocking calls (Redis, resets); "
        "calls are answered on one event loop",
    )
    workers: int = Field(
        1,
        ge=1,
        description="server processes sharing the port (SO_REUSEPORT, Linux); more than 1 "
        "needs --redis-url, for smoothing state every process sees",
    )
    reload_interval: float = Field(2.0, gt=0, description="seconds between registry scans")
    default_model: str | None = Field(None, description="model answering unpinned requests")
    prefer_cuda: bool = Field(True, description="use onnxruntime's CUDA provider if it loads")
    idempotency_cache: int = Field(
        10_000,
        ge=0,
        description="request ids remembered (no answers) to refuse a reused or superseded id; "
        "a retry of a portfolio's latest request is answered from its state regardless",
    )
    grace_seconds: float = Field(10.0, ge=0, description="SIGTERM: time for in-flight calls")
    drain_seconds: float = Field(
        2.0, ge=0, description="SIGTERM: at most this long, new calls get UNAVAILABLE first"
    )
    max_connection_age_seconds: float = Field(
        300.0,
        gt=0,
        description="close each client connection (GOAWAY) after about this long, so clients "
        "reconnect and new replicas get their share",
    )
    max_connection_age_grace_seconds: float = Field(
        30.0, ge=0, description="calls in flight on a closing connection get this long to finish"
    )

    @model_validator(mode="after")
    def _check_combinations(self) -> ServerConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("--tls-client-ca (mTLS) needs --tls-cert and --tls-key")
        if self.workers > 1 and self.redis_url is None:
            raise ValueError(
                f"--workers {self.workers} needs --redis-url: each worker process answers any "
                "portfolio, so the smoothing state must live in a store they share"
            )
        return self

    def dial_target(self, port: int) -> str:
        """``host:port`` for a client on this host: a wildcard bind address is dialled locally."""
        host = "127.0.0.1" if self.host in {"0.0.0.0", "[::]", "::"} else self.host
        return f"{host}:{port}"

    def serve_metrics(self, registry: CollectorRegistry) -> tuple[Any, int | None]:
        """Start ``/metrics`` on ``metrics_port``: the HTTP server and its port (Nones: off)."""
        if self.metrics_port is None:
            return None, None
        from prometheus_client import start_http_server  # only a process serving /metrics needs it

        addr = self.host.strip("[]")  # gRPC writes [::]; getaddrinfo wants ::
        http, _ = start_http_server(self.metrics_port, addr=addr, registry=registry)
        return http, http.server_port


class ServerSettings(ServerConfig, BaseSettings):
    """``ServerConfig`` as pydantic-settings' sources read it; the server gets a plain one."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )


def load_server_config(
    flags: Mapping[str, Any],
    config_file: str | Path | None = None,
    flag_names: Mapping[str, str] | None = None,
) -> ServerConfig:
    """Flags > ``ALLOCATOR_*`` > ``config_file`` > defaults; ``ConfigError`` names where a bad
    value came from (``--port``, ``ALLOCATOR_PORT``, ``port (in FILE)``). ``flag_names`` maps a
    field to its flag where they differ."""
    file_values: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"--config {path}: no such file")
        try:
            file_values = YamlConfigSettingsSource(ServerSettings, yaml_file=path)()
        except Exception as exc:  # a YAML syntax error, whatever the parser raises it as
            raise ConfigError(f"--config {path}: not a YAML mapping of settings: {exc}") from exc
    env_values = EnvSettingsSource(ServerSettings)()
    names = dict(flag_names or {})

    origin = {
        **{key: f"{key} (in {config_file})" for key in file_values},
        **{key: f"{ENV_PREFIX}{key.upper()}" for key in env_values},
        **{key: names.get(key, f"--{key.replace('_', '-')}") for key in flags},
    }
    merged = {**file_values, **env_values, **flags}
    try:
        return ServerConfig(**merged)
    except ValidationError as exc:
        raise ConfigError("; ".join(_describe(e, origin, names) for e in exc.errors())) from exc


def _describe(error: Any, origin: Mapping[str, str], flag_names: Mapping[str, str]) -> str:
    """``WHERE: reason`` for one error; a check across fields names its flags itself."""
    message = str(error["msg"]).removeprefix("Value error, ")
    if not error["loc"]:
        return message
    key = str(error["loc"][0])
    if key in origin:
        return f"{origin[key]}: {message}"
    flag = flag_names.get(key, f"--{key.replace('_', '-')}")
    return f"{key}: {message} (set {flag}, {ENV_PREFIX}{key.upper()} or `{key}:` in --config)"
