"""Settings: conf/default.toml documents exactly the model's defaults; bad files fail with a named key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rebalancer.config import ConfigError, Settings, load_settings

ROOT = Path(__file__).resolve().parents[1]


def test_default_toml_equals_the_model_defaults() -> None:
    assert load_settings(ROOT / "conf" / "default.toml") == Settings()


def test_no_file_gives_defaults() -> None:
    assert load_settings(None).migration.max_parallel_per_node == 10
    assert load_settings(None).rebalance.history_threshold == 500


def test_partial_file_keeps_other_defaults(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text('[storage]\nengine = "delta-rs"\n[migration]\nmax_parallel_per_node = 5\n')
    settings = load_settings(conf)
    assert settings.storage.engine == "delta-rs"
    assert settings.migration.max_parallel_per_node == 5
    assert settings.spark == Settings().spark


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[storage]\nengin = "auto"\n', "storage.engin"),
        ('[storage]\nengine = "postgres"\n', "storage.engine"),
        ("[migration]\nmax_parallel_per_node = 0\n", "migration.max_parallel_per_node"),
        ("[nope]\nx = 1\n", "nope"),
        ('[storage]\ncatalog_prefix = "a.b.c"\n', "storage.catalog_prefix"),
        ("[storage]\ndriver_replicas = -1\n", "storage.driver_replicas"),
        ('[storage]\ndriver_replicas = "lots"\n', "storage.driver_replicas"),
    ],
)
def test_invalid_values_name_the_key(tmp_path: Path, text: str, expected: str) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_text(text)
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.")):
        load_settings(conf)


def test_missing_and_malformed_files_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[storage\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(bad)


def test_overrides_are_validated() -> None:
    assert Settings().with_overrides(storage={"warehouse": "w2"}).storage.warehouse == "w2"
    with pytest.raises(ConfigError, match="storage.engine"):
        Settings().with_overrides(storage={"engine": "x"})
