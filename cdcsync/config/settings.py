"""Connection and runtime settings.

Precedence, lowest first: built-in defaults < ``cdcsync.yaml`` < ``CDCSYNC__...`` environment variables < CLI
flags. Nesting uses ``__`` (``CDCSYNC__POSTGRES__DSN``, ``CDCSYNC__KAFKA__OPTIONS__SECURITY_PROTOCOL``), as
Kubernetes secrets and 12-factor deployments expect. When nothing is set, every connection points at the local
dev stack (``cdcsync dev up``), so a new user needs no configuration at all.

Secrets (the Postgres DSN and the ClickHouse URL may hold a password) are ``SecretStr``: they never show in
``repr`` or logs; use :func:`redact_dsn` to display a DSN or URL.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from cdcsync.core.errors import ConfigError

SETTINGS_FILE_ENV = "CDCSYNC_CONFIG"
DEFAULT_SETTINGS_FILE = Path("cdcsync.yaml")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DevStackSettings(_Section):
    """Ports of the local services started by ``cdcsync dev up``."""

    postgres_port: int = 54329
    kafka_port: int = 19092
    kafka_controller_port: int = 19093
    clickhouse_port: int = 18123
    schema_registry_port: int = 18081
    connect_port: int = 18083
    """Kafka Connect's REST API (``cdcsync dev up --with-debezium``)."""
    debezium_database: str = "cdcsync_source"
    debezium_format: str = "json"
    debezium_schemas_enable: bool = True
    spark_master_port: int = 17077
    """The standalone master of ``cdcsync dev up --spark-workers N``."""
    spark_master_webui_port: int = 18080
    spark_worker_webui_port: int = 18091
    """Worker i (1-based) serves its web UI on this port + i - 1."""
    spark_worker_cores: int = 1
    spark_worker_memory: str = "2g"


class KafkaSettings(_Section):
    bootstrap_servers: str | None = None
    reader: Literal["auto", "spark"] = "auto"
    """Who reads a batch's messages: ``auto``, the executors themselves with librdkafka wherever the source's
    client options allow (:mod:`cdcsync.sources.kafka_fetch`), else Spark's Kafka reader; ``spark``, always
    Spark's reader. Spark plans every batch and keeps the checkpoint either way."""
    options: dict[str, str] = Field(default_factory=dict)
    """Native consumer keys (``security.protocol``, ``sasl.mechanism`` ...), passed to the Kafka client verbatim.
    Environment variables cannot hold dots, so ``CDCSYNC__KAFKA__OPTIONS__SECURITY_PROTOCOL`` arrives as
    ``security_protocol`` and is mapped to ``security.protocol`` (Kafka's own keys never contain ``_``)."""

    @field_validator("options")
    @classmethod
    def _native_keys(cls, options: dict[str, str]) -> dict[str, str]:
        return {key if "." in key else key.replace("_", "."): value for key, value in options.items()}


class SchemaRegistrySettings(_Section):
    """The Confluent-compatible registry that ``format: avro`` sources fetch writer schemas from."""

    url: str | None = None
    """Defaults to the dev stack's Apicurio Registry (its ``/apis/ccompat/v7``). May hold ``user:password@``, so it
    is shown only redacted."""
    basic_auth_user_info: SecretStr | None = None
    """``user:password`` for HTTP basic auth (the client's ``basic.auth.user.info``); never logged."""
    options: dict[str, str] = Field(default_factory=dict)
    """Native ``SchemaRegistryClient`` keys (``ssl.ca.location`` ...), verbatim; ``_`` maps to ``.`` as for Kafka."""
    retry_timeout_s: float = Field(default=60.0, gt=0)
    """How long executors retry an unreachable registry (connection refused, HTTP 5xx) before the message is
    handled per ``on_decode_error``."""

    @field_validator("options")
    @classmethod
    def _native_keys(cls, options: dict[str, str]) -> dict[str, str]:
        return {key if "." in key else key.replace("_", "."): value for key, value in options.items()}


class PostgresSettings(_Section):
    dsn: SecretStr | None = None


class ClickHouseSettings(_Section):
    url: SecretStr | None = None
    """ClickHouse HTTP(S) interface, ``http://user:password@host:8123[/database]`` as clickhouse-connect's
    ``get_client(dsn=...)`` takes it. A secret (it may hold a password); defaults to the dev stack's server."""


class RetrySettings(_Section):
    """How long ``run`` waits out a dependency that is away (Postgres restarting, ClickHouse or the broker down)."""

    budget_s: float = Field(default=120.0, gt=0)
    """Retries with backoff (0.5 s doubling to 15 s) go on this long from the first failure of a batch; then
    ``run`` exits 1 naming what failed. Nothing of the batch is committed, so the next run replays it."""


class MetricsSettings(_Section):
    """Prometheus metrics and the health endpoint of ``cdcsync run`` (docs/operations.md#metrics)."""

    port: int | None = Field(default=None, ge=0, le=65535)
    """Serve ``/metrics`` and ``/healthz`` on this port (``run --metrics-port``); None: no server."""
    host: str = "0.0.0.0"
    """The address the server listens on (all interfaces by default, as a scraper in another pod needs)."""
    max_batch_age_s: float | None = Field(default=None, gt=0)
    """``/healthz`` answers 503 when the last batch landed longer ago than this (None: the age is only shown,
    since a quiet topic runs no batches)."""
    otlp_endpoint: str | None = None
    """Also push the same metrics over OTLP/HTTP to this URL (``http://collector:4318/v1/metrics``); needs the
    ``otlp`` extra (``pip install 'cdcsync[otlp]'``)."""
    otlp_interval_s: float = Field(default=30.0, gt=0)


class RunSettings(_Section):
    """How often ``cdcsync run`` starts a micro-batch, and how it stops."""

    trigger_interval_s: float = Field(default=1.0, ge=0)
    """Spark's ``processingTime`` trigger of every streaming query: a micro-batch starts at most this often, or as
    soon as the one before ends when that took longer. 0 starts each as soon as the one before ended (Spark's own
    default trigger); an idle query then asks the brokers for new offsets every few milliseconds. Latency against
    cost per change: docs/benchmarks.md, "Latency: commit to visible"."""

    stop_timeout_s: float = Field(default=25.0, gt=0)
    """After SIGTERM or Ctrl-C, how long the batch in flight may take to finish (Kubernetes sends SIGKILL 30 s
    after SIGTERM by default). Past it, ``run`` exits 1 without committing that batch: the next run replays it."""

    overlap_merges: bool = True
    """Merge a batch into its Postgres sinks while the next batch is read and staged (a source whose sinks are all
    ``type: postgres`` or ``postgres_aggregate`` and which fills no dynamic table): the merge is one Postgres
    backend's work, which otherwise leaves a core idle. Exactly-once either way (docs/exactly-once.md, "Overlapped
    merges"); false merges each batch before the next one starts."""


class SparkSettings(_Section):
    master: str = "local[2]"
    conf: dict[str, str] = Field(default_factory=dict)
    """Extra Spark configuration, native keys (``spark.sql.shuffle.partitions``...). From the environment
    (``CDCSYNC__SPARK__CONF__<key>``) a key keeps the case it is written in, because Spark's keys are
    case-sensitive (``spark.driver.extraJavaOptions``); a key written all in capitals is taken in lower case
    (``CDCSYNC__SPARK__CONF__SPARK.HADOOP.FS.S3A.ENDPOINT``)."""
    class_data_sharing: bool = True
    """Start the driver JVM from the class-data-sharing archive ``make jars`` builds, when it is there
    (:mod:`cdcsync.runtime.cds`): a faster Spark start, nothing else changes."""

    @field_validator("conf")
    @classmethod
    def _keys_as_written(cls, conf: dict[str, str]) -> dict[str, str]:
        # The environment source reads variable names case-insensitively and hands the keys over in lower case.
        restored = dict(conf)
        for key in _spark_conf_keys_in_environment():
            if key != key.lower() and key.lower() in restored:
                restored[key] = restored.pop(key.lower())
        return restored


_SPARK_CONF_ENV_PREFIX = "CDCSYNC__SPARK__CONF__"


def _spark_conf_keys_in_environment() -> list[str]:
    """The Spark keys set through ``CDCSYNC__SPARK__CONF__<key>`` variables, as written (all capitals lowered)."""
    keys = []
    for name in os.environ:
        if name.upper().startswith(_SPARK_CONF_ENV_PREFIX) and len(name) > len(_SPARK_CONF_ENV_PREFIX):
            key = name[len(_SPARK_CONF_ENV_PREFIX) :]
            keys.append(key.lower() if key == key.upper() else key)
    return keys


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CDCSYNC__",
        env_nested_delimiter="__",
        extra="forbid",
        case_sensitive=False,
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    schema_registry: SchemaRegistrySettings = Field(default_factory=SchemaRegistrySettings)
    postgres: PostgresSettings = Field(default_factory=PostgresSettings)
    clickhouse: ClickHouseSettings = Field(default_factory=ClickHouseSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    run: RunSettings = Field(default_factory=RunSettings)
    devstack: DevStackSettings = Field(default_factory=DevStackSettings)
    state_dir: Path = Path(".cdcsync")
    """Checkpoints and dev-stack data live here."""
    migrations_dir: Path = Path("migrations")
    job_mode: bool = False
    """End ``run`` after the bounded phases, as the pipeline's ``job_mode: true`` does."""

    @model_validator(mode="after")
    def _default_to_dev_stack(self) -> Settings:
        if self.kafka.bootstrap_servers is None:
            self.kafka.bootstrap_servers = f"127.0.0.1:{self.devstack.kafka_port}"
        if self.schema_registry.url is None:
            self.schema_registry.url = f"http://127.0.0.1:{self.devstack.schema_registry_port}/apis/ccompat/v7"
        if self.postgres.dsn is None:
            self.postgres.dsn = SecretStr(f"postgresql://cdcsync@127.0.0.1:{self.devstack.postgres_port}/cdcsync")
        if self.clickhouse.url is None:
            self.clickhouse.url = SecretStr(f"http://default@127.0.0.1:{self.devstack.clickhouse_port}")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        settings_file = Path(os.environ.get(SETTINGS_FILE_ENV, DEFAULT_SETTINGS_FILE))
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if settings_file.is_file():
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=settings_file))
        return tuple(sources)

    @property
    def postgres_dsn(self) -> str:
        assert self.postgres.dsn is not None
        return self.postgres.dsn.get_secret_value()

    @property
    def clickhouse_url(self) -> str:
        assert self.clickhouse.url is not None
        return self.clickhouse.url.get_secret_value()

    @property
    def bootstrap_servers(self) -> str:
        assert self.kafka.bootstrap_servers is not None
        return self.kafka.bootstrap_servers

    @property
    def schema_registry_url(self) -> str:
        assert self.schema_registry.url is not None
        return self.schema_registry.url

    def checkpoint_dir(self, pipeline: str, source: str) -> Path:
        return self.state_dir.resolve() / "checkpoints" / pipeline / source


def load_settings(**flags: Any) -> Settings:
    """Build settings from every layer; ``flags`` are CLI values (None means "not given")."""
    import yaml

    overrides = _nest({key: value for key, value in flags.items() if value is not None})
    settings_file = os.environ.get(SETTINGS_FILE_ENV, str(DEFAULT_SETTINGS_FILE))
    try:
        return Settings(**overrides)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            path = ".".join(str(p) for p in item["loc"])
            variable = "CDCSYNC__" + path.replace(".", "__").upper()
            problems.append(f"{path} (or {variable}): {item['msg']}")
        raise ConfigError(
            "settings are invalid", problems, hint=f"check {settings_file} and CDCSYNC__* variables"
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{settings_file}: not valid YAML{at}: {getattr(error, 'problem', error)}") from None


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"postgres__dsn": x}`` -> ``{"postgres": {"dsn": x}}`` so flags can address nested settings."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split("__")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


_DSN_PASSWORD_RE = re.compile(r"(?P<head>://[^:/@]+:)(?P<password>[^@]*)(?P<tail>@)")
_KV_PASSWORD_RE = re.compile(r"(?P<head>password\s*=\s*)(?P<password>'[^']*'|\S+)", re.IGNORECASE)


def redact_dsn(dsn: str) -> str:
    """Hide the password of a URL or key=value DSN so it can be shown or logged."""
    dsn = _DSN_PASSWORD_RE.sub(lambda m: f"{m['head']}***{m['tail']}", dsn)
    return _KV_PASSWORD_RE.sub(lambda m: f"{m['head']}***", dsn)
