"""Strict settings model.

Defaults live in the model and are written out, documented, in ``conf/default.toml`` (a test keeps the two equal).
A job receives a :class:`Settings` object as an argument; nothing reads configuration from global state.
Unknown keys and out-of-range values are errors whose message says which key and what is allowed.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "AUTO_ENGINE", "DELTA_RS", "DELTA_SPARK", "ConfigError", "EngineSetting", "IgniteSettings", "Settings",
    "load_settings",
]

#: What ``storage.engine`` may say: the storage engines' names, declared here once (config is validated before
#: storage is imported; :data:`rebalancer.storage.ENGINES` maps each name to how its warehouse is opened), and
#: ``auto``: the session decides (delta-spark when the Delta classes are in it, else delta-rs).
EngineSetting = Literal["auto", "delta-spark", "delta-rs"]
AUTO_ENGINE, DELTA_SPARK, DELTA_RS = get_args(EngineSetting)


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names the key and what is allowed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StorageSettings(_Strict):
    engine: EngineSetting = AUTO_ENGINE
    warehouse: str = "warehouse"
    catalog_prefix: str = Field("", pattern=r"^([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?)?$")
    commit_retries: int = Field(5, ge=0, le=100)
    concurrent_commits: int = Field(4, ge=1, le=64)
    driver_reader: bool = True
    driver_writer: bool = True
    # A number of replicas, or auto: the storage module sizes it from the master and the machine's memory.
    driver_replicas: Annotated[int, Field(ge=0)] | Literal["auto"] = "auto"


class SparkSettings(_Strict):
    master: str = "local[*]"
    app_name: str = "rebalancer"
    shuffle_partitions: int = Field(8, ge=1)
    driver_memory: str = Field("4g", pattern=r"^[0-9]+[kmgtKMGT]?$")
    adaptive: bool = False
    # classic: a JVM SparkContext in this process. connect: a local Spark Connect server and a Connect client
    # session, as on Databricks serverless and shared clusters (no SparkContext on any path rebalancer uses).
    api_mode: Literal["classic", "connect"] = "classic"


class AffinitySettings(_Strict):
    ignite_ids_as_strings: bool = False
    balanced_spread: bool = True
    arrow_batch_rows: int = Field(4096, ge=1)


class GenerateSettings(_Strict):
    avg_partition_bytes: int = Field(209_715_200, ge=0)
    avg_entry_bytes: int = Field(1024, ge=1)
    zones: int = Field(3, ge=1)
    nodes_per_host: int = Field(1, ge=1)


class RebalanceSettings(_Strict):
    history_threshold: int = Field(500, ge=0)


class MigrationSettings(_Strict):
    max_parallel_per_node: int = Field(10, ge=1)
    full_rebalance: Literal["entries", "files"] = "entries"
    file_chunk_bytes: int = Field(4_194_304, ge=4096, multiple_of=4096)
    node_bandwidth_bytes_per_s: float = Field(2.5e9, gt=0)
    entry_stream_bytes_per_s: float = Field(4.0e8, gt=0)
    file_stream_bytes_per_s: float = Field(1.25e9, gt=0)
    overhead_s: float = Field(0.1, ge=0)


class ValidationSettings(_Strict):
    strict: bool = False


class BaselineConfig(_Strict):
    auto_adjust: bool = True
    auto_adjust_timeout_s: float = Field(0.0, ge=0)

    @property
    def follows_at_once(self) -> bool:
        """The baseline is the alive servers after every event (auto-adjust without a timeout)."""
        return self.auto_adjust and self.auto_adjust_timeout_s <= 0


class KafkaSettings(_Strict):
    bootstrap: str = ""
    include_internal: bool = True
    client_timeout_s: float = Field(15.0, gt=0)
    throttle_bytes_per_s: int = Field(0, ge=0)
    poll_interval_s: float = Field(0.5, gt=0)
    execute_timeout_s: float = Field(600.0, gt=0)
    until_stable_rounds: int = Field(10, ge=1)


class IgniteSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(10800, ge=1, le=65535)
    control: list[str] = ["control.sh"]
    client_timeout_s: float = Field(15.0, gt=0)
    entry_bytes: int = Field(1024, ge=0)
    include_system: bool = False
    attributes: list[str] = []
    backup_filters: dict[str, list[str]] = {}


class Settings(_Strict):
    """Every setting of the engine; see ``conf/default.toml`` for what each means."""

    storage: StorageSettings = StorageSettings()
    spark: SparkSettings = SparkSettings()
    affinity: AffinitySettings = AffinitySettings()
    generate: GenerateSettings = GenerateSettings()
    rebalance: RebalanceSettings = RebalanceSettings()
    migration: MigrationSettings = MigrationSettings()
    validation: ValidationSettings = ValidationSettings()
    baseline: BaselineConfig = BaselineConfig()
    kafka: KafkaSettings = KafkaSettings()
    ignite: IgniteSettings = IgniteSettings()

    def with_overrides(self, **sections: dict[str, Any]) -> Settings:
        """A copy with some keys replaced, validated like a file: ``s.with_overrides(storage={"warehouse": "w"})``."""
        data = self.model_dump()
        for section, values in sections.items():
            data.setdefault(section, {}).update(values)
        return _validate(data, source="overrides")


def _validate(data: dict[str, Any], source: str) -> Settings:
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration in {source}: {problems}") from None


def load_settings(path: str | Path | None = None) -> Settings:
    """Load settings from a TOML file; ``None`` gives the defaults.

    Raises:
        ConfigError: the file is missing, not TOML, or has unknown keys or invalid values.
    """
    if path is None:
        return Settings()
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"configuration file {file} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {file} is not valid TOML: {exc}") from None
    return _validate(data, source=str(file))
