"""Configuration loading, environment overrides and validation messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaingate import config
from chaingate.rpc.methods import MethodTable

REPO = Path(__file__).resolve().parents[1]


def test_the_example_and_dev_configs_load() -> None:
    settings = config.load(REPO / "config" / "chaingate.example.toml", environ={})
    mainnet = settings.network("ethereum", "mainnet")
    assert mainnet is not None and len(mainnet.upstreams) == 2
    assert mainnet.upstreams[1].display_name() == "provider-b"
    assert settings.network("solana", "mainnet").family == "solana"  # type: ignore[union-attr]
    dev = config.load(REPO / "config" / "dev.toml", environ={})
    assert dev.network("ethereum", "devnet").testnet  # type: ignore[union-attr]


def test_environment_overrides_file_values() -> None:
    settings = config.load(
        REPO / "config" / "chaingate.example.toml",
        environ={
            "CHAINGATE_SERVER__PORT": "9001",
            "CHAINGATE_OBSERVABILITY__ADMIN_TOKEN": "s3cret",
            "CHAINGATE_RPC__COALESCE": "false",
            "CHAINGATE_DATA_DIR": "/tmp/x",
            "UNRELATED": "1",
        },
    )
    assert settings.server.port == 9001
    assert settings.observability.admin_token == "s3cret"
    assert settings.rpc.coalesce is False
    assert settings.data_dir == "/tmp/x"


def _upstream(**upstream: object) -> dict[str, object]:
    return {"chains": {"eth": {"main": {"upstreams": [upstream]}}}}


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"server": {"port": 70000}}, "server.port"),
        ({"server": {"bogus": 1}}, "bogus"),
        ({"server": {"leader_timeout": 0.2}}, "server.leader_timeout"),
        # A look may take 3 s before its process counts its connection lost.
        ({"server": {"leader_timeout": 3.9}}, "server.leader_timeout"),
        ({"server": {"leader_timeout": float("nan")}}, "server.leader_timeout"),
        ({"chains": {"eth": {"main": {"upstreams": []}}}}, "at least one upstream"),
        ({"chains": {"eth": {"main": {"upstreams": [{"url": "ftp://x"}]}}}}, "http:// or https://"),
        (
            {
                "chains": {
                    "eth": {"main": {"upstreams": [{"url": "http://a"}, {"url": "http://a"}]}}
                }
            },
            "distinct names",
        ),
        (
            {"chains": {"eth": {"main": {"family": "cosmos", "upstreams": [{"url": "http://a"}]}}}},
            "family",
        ),
        (_upstream(url="http://a", http_version="h2"), "needs an https:// url"),
        (_upstream(url="https://a", http_version="http2"), "http_version"),
        (_upstream(url="https://a", headers={"Host": "b"}), "chaingate's to set"),
        (_upstream(url="https://a", headers={"Connection": "close"}), "chaingate's to set"),
        (_upstream(url="https://a", headers={":path": "/x"}), "invalid upstream header"),
    ],
)
def test_invalid_settings_name_the_problem(mapping: dict, message: str) -> None:
    with pytest.raises(config.ConfigError, match=message):
        config.from_mapping(mapping, environ={})


def test_upstream_names_never_expose_url_paths() -> None:
    upstream = config.UpstreamSettings(url="https://eth.example.com/v2/SECRETKEY?token=abc")
    assert upstream.display_name() == "eth.example.com:443"
    assert "SECRET" not in upstream.display_name()


def test_the_method_table_loads_with_sane_defaults() -> None:
    table = MethodTable.load(REPO / "config" / "methods.toml")
    evm = table.family("evm")
    assert evm["eth_blockNumber"].cu == 1
    assert evm["eth_getStorageAt"].cu_historical == 20
    assert (
        evm["eth_sendRawTransaction"].scope == "rpc:write"
        and not evm["eth_sendRawTransaction"].retry
    )
    assert evm["eth_getLogs"].retry and evm["eth_getLogs"].scope == "rpc:read"
    assert not evm["eth_getFilterChanges"].retry
    assert evm["debug_traceTransaction"].tcu > evm["debug_traceTransaction"].cu
    assert table.family("solana")["sendTransaction"].is_write
    assert table.passthrough.is_write and not table.passthrough.retry
    for spec in evm.values():
        assert spec.cu > 0
        if spec.is_write:
            assert not spec.coalescible and not spec.retry


def test_a_broken_method_table_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "methods.toml"
    path.write_text('[evm]\neth_x = { cu = "many" }\n')
    with pytest.raises(ValueError, match=r"methods\.toml"):
        MethodTable.load(path)


def test_secrets_from_the_environment_are_taken_as_given() -> None:
    """A 0x-hex paymaster key or an all-digit pepper is text, never a TOML number."""
    key = "0x" + "ab" * 32
    settings = config.from_mapping(
        {},
        environ={
            "CHAINGATE_PAYMASTER__KEY": key,
            "CHAINGATE_AUTH__PEPPER": "0123456789",
            "CHAINGATE_SERVER__PORT": "8081",
        },
    )
    assert settings.paymaster.key == key
    assert settings.auth.pepper == "0123456789"
    assert settings.server.port == 8081  # other settings are still typed values


def test_every_section_and_nested_table_is_reachable_from_the_environment() -> None:
    """Nested tables (webhooks.smtp) and every section (dashboard) take variables too."""
    settings = config.from_mapping(
        {"webhooks": {"smtp": {"url": "smtp://mail.example:587"}}},
        environ={
            "CHAINGATE_WEBHOOKS__SMTP__PASSWORD": "0123456789",
            "CHAINGATE_DASHBOARD__SESSION_IDLE_MINUTES": "5",
            "CHAINGATE_SERVER__NO_SUCH_SETTING": "1",  # names no setting: ignored
        },
    )
    assert settings.webhooks.smtp.password == "0123456789"
    assert settings.webhooks.smtp.url == "smtp://mail.example:587"  # the file's, kept
    assert settings.dashboard.session_idle_minutes == 5
