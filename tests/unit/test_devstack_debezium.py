"""The Debezium dev-stack service's generated configs, without starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcsync.core.errors import ConfigError
from cdcsync.devstack import DevStackConfig, debezium


def test_connector_config_defaults_and_filters() -> None:
    config = debezium.connector_config(
        database="src", topic_prefix="p", slot_name="s", publication_name="pub", port=5432, tables=["public.a_b"]
    )
    assert config["connector.class"] == "io.debezium.connector.postgresql.PostgresConnector"
    assert config["plugin.name"] == "pgoutput"
    assert config["publication.autocreate.mode"] == "filtered"
    assert config["table.include.list"] == r"public\.a_b"
    assert "schema.include.list" not in config
    assert config["decimal.handling.mode"] == "precise"
    assert config["time.precision.mode"] == "adaptive"
    assert config["snapshot.mode"] == "initial"
    assert config["skipped.operations"] == "none"  # truncates are published (Debezium's default skips them)
    assert config["value.converter.schemas.enable"] == "true"
    assert "database.password" not in config


def test_connector_config_all_tables_overrides_and_formats() -> None:
    config = debezium.connector_config(
        database="src",
        topic_prefix="p",
        slot_name="s",
        publication_name="pub",
        port=5432,
        schemas_enable=False,
        overrides={"snapshot.mode": "no_data"},
    )
    assert config["publication.autocreate.mode"] == "all_tables"
    assert config["schema.include.list"] == "public"
    assert config["value.converter.schemas.enable"] == "false"
    assert config["snapshot.mode"] == "no_data"
    with pytest.raises(ConfigError, match="schema registry"):
        debezium.connector_config(
            database="d", topic_prefix="p", slot_name="s", publication_name="p", port=1, value_format="avro"
        )
    with pytest.raises(ConfigError, match="protobuf"):
        debezium.connector_config(
            database="d", topic_prefix="p", slot_name="s", publication_name="p", port=1, value_format="protobuf"
        )


def test_avro_connector_config_writes_the_confluent_wire_format_through_apicurio() -> None:
    config = debezium.connector_config(
        database="d",
        topic_prefix="p",
        slot_name="s",
        publication_name="p",
        port=1,
        value_format="avro",
        schema_registry_url="http://127.0.0.1:18081/apis/ccompat/v7/",
        overrides={"decimal.handling.mode": "string"},
    )
    for side in ("key", "value"):
        assert config[f"{side}.converter"] == "io.apicurio.registry.utils.converter.AvroConverter"
        assert config[f"{side}.converter.apicurio.registry.url"] == "http://127.0.0.1:18081/apis/registry/v2"
        assert config[f"{side}.converter.apicurio.registry.as-confluent"] == "true"
        assert config[f"{side}.converter.apicurio.registry.use-id"] == "contentId"
        assert config[f"{side}.converter.apicurio.registry.auto-register"] == "true"
        assert config[f"{side}.converter.apicurio.registry.headers.enabled"] == "false"
        assert f"{side}.converter.schemas.enable" not in config
    assert config["decimal.handling.mode"] == "string"


def test_plugin_directory_gets_the_converter_manifest(tmp_path: Path) -> None:
    import zipfile

    jar = tmp_path / "a.jar"
    jar.write_bytes(b"")
    cfg = DevStackConfig(state_dir=tmp_path)
    stray = debezium.plugin_dir(cfg) / "no-longer-wanted"
    stray.mkdir(parents=True)
    postgres = debezium.ConnectPlugin("debezium-connector-postgres", [jar], debezium.SERVICE_MANIFESTS)
    debezium._link_plugins(cfg, [postgres, debezium.ConnectPlugin("complete-tarball", [jar])])
    plugin = debezium.plugin_dir(cfg) / "debezium-connector-postgres"
    assert (plugin / "a.jar").resolve() == jar.resolve()
    with zipfile.ZipFile(plugin / "cdcsync-plugin-manifests.jar") as manifests:
        text = manifests.read("META-INF/services/org.apache.kafka.connect.storage.Converter").decode()
    assert text.splitlines() == ["io.apicurio.registry.utils.converter.AvroConverter"]
    assert sorted(p.name for p in (debezium.plugin_dir(cfg) / "complete-tarball").iterdir()) == ["a.jar"]
    assert not stray.exists()


def test_worker_properties_and_default_connector(tmp_path: Path) -> None:
    cfg = DevStackConfig(state_dir=tmp_path, kafka_port=29999, postgres_port=55999, connect_port=28999)
    props = dict(line.split("=", 1) for line in debezium.worker_properties(cfg).splitlines())
    overridden = dict(
        line.split("=", 1) for line in debezium.worker_properties(cfg, {"offset.flush.interval.ms": "7"}).splitlines()
    )
    assert overridden == {**props, "offset.flush.interval.ms": "7"}
    assert props["bootstrap.servers"] == "127.0.0.1:29999"
    assert props["listeners"] == "http://127.0.0.1:28999"
    assert props["plugin.path"] == str(debezium.plugin_dir(cfg))
    assert props["offset.storage.file.filename"] == str(debezium.offsets_file(cfg))
    default = debezium.default_connector_config(cfg)
    assert default["database.dbname"] == "cdcsync_source" == default["topic.prefix"]
    assert default["database.port"] == "55999"
    assert debezium.source_dsn(cfg) == "postgresql://cdcsync@127.0.0.1:55999/cdcsync_source"
    assert not debezium.was_started(cfg)
