"""Typed settings: msgspec Structs loaded from a TOML file, with environment overrides.

Precedence: built-in defaults < the TOML file < environment variables.  An environment
variable ``CHAINGATE_<SECTION>__<KEY>`` overrides ``[section] key`` (for example
``CHAINGATE_SERVER__PORT=9000``); its value is read as a TOML literal when it parses as one
(numbers, booleans, quoted strings) and as a plain string otherwise.  Secrets such as
``observability.admin_token`` are best given this way rather than written into the file.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import msgspec.inspect

from chaingate.config.chains import (
    FAMILY_DEFAULTS,
    RESERVED_UPSTREAM_HEADERS,
    FollowerSettings,
    GasSettings,
    HedgeSettings,
    IndexerSettings,
    LogRangeSettings,
    MetadataSettings,
    NetworkBundlerSettings,
    NetworkSettings,
    ReadYourWritesSettings,
    UpstreamSettings,
    WalletSettings,
)
from chaingate.config.leases import MIN_LEADER_TIMEOUT, QUERY_TIMEOUT
from chaingate.config.network import Family, Network
from chaingate.config.server import (
    AuthSettings,
    DashboardSettings,
    ObservabilitySettings,
    OutboundSettings,
    RpcSettings,
    ServerSettings,
    StoreSettings,
    WebSocketSettings,
)
from chaingate.config.services import (
    BundlerSettings,
    PaymasterSettings,
    SimulationSettings,
    SmtpSettings,
    WebhookSettings,
)

# The sections live in modules of their own (server, chains, services); they are named
# here too, so callers import every setting from ``chaingate.config``.
__all__ = [
    "ENV_PREFIX",
    "RESERVED_UPSTREAM_HEADERS",
    "AuthSettings",
    "BundlerSettings",
    "ConfigError",
    "DashboardSettings",
    "Family",
    "FollowerSettings",
    "GasSettings",
    "HedgeSettings",
    "IndexerSettings",
    "LogRangeSettings",
    "MetadataSettings",
    "Network",
    "NetworkBundlerSettings",
    "NetworkSettings",
    "ObservabilitySettings",
    "OutboundSettings",
    "PaymasterSettings",
    "ReadYourWritesSettings",
    "RpcSettings",
    "ServerSettings",
    "Settings",
    "SimulationSettings",
    "SmtpSettings",
    "StoreSettings",
    "UpstreamSettings",
    "WalletSettings",
    "WebSocketSettings",
    "WebhookSettings",
    "apply_env",
    "config_file",
    "default_config_dir",
    "follows_any",
    "from_mapping",
    "load",
    "methods_path",
]

ENV_PREFIX = "CHAINGATE_"


class ConfigError(Exception):
    """The configuration cannot be used; the message says which setting and why."""


class Settings(msgspec.Struct, forbid_unknown_fields=True):
    server: ServerSettings = msgspec.field(default_factory=ServerSettings)
    rpc: RpcSettings = msgspec.field(default_factory=RpcSettings)
    observability: ObservabilitySettings = msgspec.field(default_factory=ObservabilitySettings)
    store: StoreSettings = msgspec.field(default_factory=StoreSettings)
    auth: AuthSettings = msgspec.field(default_factory=AuthSettings)
    ws: WebSocketSettings = msgspec.field(default_factory=WebSocketSettings)
    outbound: OutboundSettings = msgspec.field(default_factory=OutboundSettings)
    paymaster: PaymasterSettings = msgspec.field(default_factory=PaymasterSettings)
    webhooks: WebhookSettings = msgspec.field(default_factory=WebhookSettings)
    bundler: BundlerSettings = msgspec.field(default_factory=BundlerSettings)
    dashboard: DashboardSettings = msgspec.field(default_factory=DashboardSettings)
    simulation: SimulationSettings = msgspec.field(default_factory=SimulationSettings)
    # Where the embedded SQLite store and chaingate dev's files live.
    data_dir: str = "~/.local/share/chaingate"
    chains: dict[str, dict[str, NetworkSettings]] = {}
    # Where relative paths in this file (methods_file) are resolved; set by the loader.
    config_dir: str = ""

    def network(self, chain: str, network: str) -> NetworkSettings | None:
        return self.chains.get(chain, {}).get(network)

    def networks(self) -> dict[Network, NetworkSettings]:
        """Every configured network, keyed by its ``Network`` (built here, once, with the
        family and testnet flag its section sets)."""
        return {
            Network(chain, name, net.family, net.testnet): net
            for chain, networks in self.chains.items()
            for name, net in networks.items()
        }


def default_config_dir() -> Path:
    """The repository's ``config/`` in a source checkout, else the copy shipped in the package."""
    package = Path(__file__).resolve().parents[1]  # this file is chaingate/config/__init__.py
    checkout = package.parents[1] / "config"
    if (checkout / "methods.toml").is_file():
        return checkout
    return package / "_defaults"


def _coerce_env_value(raw: str) -> object:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _env_target(path: list[str]) -> msgspec.inspect.Type | None:
    """The type of the setting a variable's path names; None if it names no setting.

    Any section or nested table of sections is reachable (``WEBHOOKS__SMTP__PASSWORD``);
    tables keyed by the operator's names (chains, plans) are the file's to give.
    """
    kind: msgspec.inspect.Type = msgspec.inspect.type_info(Settings)
    for part in path:
        if not isinstance(kind, msgspec.inspect.StructType):
            return None
        fields = {f.name: f.type for f in kind.fields}
        if part not in fields:
            return None
        kind = fields[part]
    return kind


def apply_env(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Overlay ``CHAINGATE_<SECTION>__<KEY>`` variables onto a raw settings mapping."""
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        kind = _env_target(path)
        if kind is None or isinstance(kind, msgspec.inspect.StructType | msgspec.inspect.DictType):
            continue
        table = data
        for part in path[:-1]:
            table = table.setdefault(part, {})
        # A text setting is taken as given: read as TOML, a 0x-hex key or an all-digit pepper
        # would become an integer.
        text = isinstance(kind, msgspec.inspect.StrType)
        table[path[-1]] = raw if text else _coerce_env_value(raw)
    return data


def _validate(settings: Settings) -> None:
    for cidr in settings.outbound.allow_cidrs:
        try:
            ipaddress.ip_network(cidr)
        except ValueError:
            raise ConfigError(f"outbound.allow_cidrs: not a network: {cidr!r}") from None
    for cidr in settings.dashboard.trusted_proxies:
        try:
            ipaddress.ip_network(cidr)
        except ValueError:
            raise ConfigError(f"dashboard.trusted_proxies: not a network: {cidr!r}") from None
    if settings.dashboard.session_idle_minutes < 1 or settings.dashboard.session_max_hours < 1:
        raise ConfigError("dashboard.session_idle_minutes and session_max_hours must be >= 1")
    if not 0 <= settings.server.port <= 65535:
        raise ConfigError("server.port must be between 0 and 65535")
    if settings.server.compress_min_bytes < 0:
        raise ConfigError("server.compress_min_bytes must be >= 0 (0: no compression)")
    workers = settings.server.workers
    if workers != "auto" and not 1 <= workers <= 256:
        raise ConfigError('server.workers must be between 1 and 256, or "auto"')
    if not MIN_LEADER_TIMEOUT <= settings.server.leader_timeout <= 3600:
        raise ConfigError(
            f"server.leader_timeout must be between {MIN_LEADER_TIMEOUT:g} and 3600 seconds"
            f" (a look at the locks may take {QUERY_TIMEOUT:g} s before its process counts"
            " its connection lost)"
        )
    if settings.store.pool_size < 1:
        raise ConfigError("store.pool_size must be >= 1")
    simulation = settings.simulation
    if min(simulation.max_bundle, simulation.max_frames, simulation.max_logs) < 1:
        raise ConfigError("simulation.max_bundle, max_frames and max_logs must be >= 1")
    if simulation.timeout <= 0 or simulation.max_concurrent < 1:
        raise ConfigError("simulation.timeout must be > 0 and max_concurrent >= 1")
    if settings.store.url and not settings.store.url.startswith(
        ("sqlite:///", "postgresql://", "postgres://")
    ):
        # Never echo the URL: it may carry a password.
        raise ConfigError("store.url must start with sqlite:///, postgresql:// or postgres://")
    for chain, networks in settings.chains.items():
        for network, net in networks.items():
            where = f"chains.{chain}.{network}"
            try:
                Network(chain, network, net.family)
            except ValueError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            if not net.upstreams:
                raise ConfigError(f"{where}: at least one upstream is required")
            names = set()
            for upstream in net.upstreams:
                parts = urlsplit(upstream.url)
                if parts.scheme not in ("http", "https") or not parts.hostname:
                    raise ConfigError(f"{where}: upstream url must be http:// or https://")
                if upstream.ws_url is not None:
                    ws = urlsplit(upstream.ws_url)
                    if ws.scheme not in ("ws", "wss") or not ws.hostname:
                        raise ConfigError(f"{where}: upstream ws_url must be ws:// or wss://")
                name = upstream.display_name()
                if name in names:
                    raise ConfigError(f"{where}: two upstreams named {name!r}; set distinct names")
                names.add(name)
                if upstream.http_version == "h2" and parts.scheme != "https":
                    raise ConfigError(f'{where}: http_version = "h2" needs an https:// url')
                for header, value in upstream.headers.items():
                    if (
                        any(c in header + value for c in "\r\n")
                        or not header.strip()
                        or not header.isascii()
                        or any(c in header for c in " :\t")
                    ):
                        raise ConfigError(f"{where}: invalid upstream header {header!r}")
                    if header.lower() in RESERVED_UPSTREAM_HEADERS:
                        raise ConfigError(
                            f"{where}: upstream header {header!r} is chaingate's to set"
                        )
                if upstream.pipeline_depth < 1 or upstream.max_connections < 1:
                    raise ConfigError(f"{where}: pipeline_depth and max_connections must be >= 1")


def _family_defaults(raw: dict[str, Any]) -> None:
    """A network's settings its family changes the defaults of (``FAMILY_DEFAULTS``: a Solana
    slot is 0.4 s, and the probe's getSlot is already the finalized slot), where the file
    leaves them out."""
    chains = raw.get("chains")
    if not isinstance(chains, dict):
        return
    for networks in chains.values():
        if not isinstance(networks, dict):
            continue
        for network in networks.values():
            if isinstance(network, dict):
                defaults = FAMILY_DEFAULTS.get(str(network.get("family", "evm")), {})
                for key, value in defaults.items():
                    network.setdefault(key, value)


def from_mapping(
    data: Mapping[str, Any],
    *,
    config_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build Settings from a parsed TOML mapping plus the environment."""
    raw = apply_env(dict(data), os.environ if environ is None else environ)
    raw["config_dir"] = str(config_dir or default_config_dir())
    _family_defaults(raw)
    try:
        settings = msgspec.convert(raw, Settings)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None
    _validate(settings)
    return settings


def load(path: str | Path, *, environ: Mapping[str, str] | None = None) -> Settings:
    """Read a TOML config file (see ``config/chaingate.example.toml``)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return from_mapping(data, config_dir=path.parent.resolve(), environ=environ)


def config_file(settings: Settings, name: str) -> Path:
    """A file named in the settings: absolute, beside the config file, or shipped default."""
    path = Path(name)
    if path.is_absolute():
        return path
    candidate = Path(settings.config_dir) / path
    if candidate.is_file():
        return candidate
    return default_config_dir() / path


def methods_path(settings: Settings) -> Path:
    return config_file(settings, settings.rpc.methods_file)


def follows_any(settings: Settings) -> bool:
    """Whether some EVM network is followed (so the process needs a store)."""
    return any(
        net.family == "evm" and net.follower.enabled
        for networks in settings.chains.values()
        for net in networks.values()
    )
