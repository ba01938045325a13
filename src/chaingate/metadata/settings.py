"""Checks on ``MetadataSettings`` (sans-IO) and what a devnet manifest adds to them."""

from __future__ import annotations

from urllib.parse import urlsplit

from chaingate.config import MetadataSettings
from chaingate.config.manifest import Manifest
from chaingate.evm.addresses import address_bytes


def _url(value: str, what: str) -> None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} must be an http(s) URL")


def _address(value: str, what: str) -> None:
    try:
        address_bytes(value)
    except ValueError:
        raise ValueError(f"{what} is not an address: {value!r}") from None


def check_settings(settings: MetadataSettings) -> None:
    """ValueError naming the first setting that cannot work."""
    for gateway in settings.ipfs_gateways:
        _url(gateway, "metadata.ipfs_gateways entries")
    if settings.image_gateway:
        _url(settings.image_gateway, "metadata.image_gateway")
    _url(settings.arweave_gateway, "metadata.arweave_gateway")
    for name in ("gateway_timeout", "fetch_timeout", "token_list_refresh", "price_ttl"):
        if getattr(settings, name) <= 0:
            raise ValueError(f"metadata.{name} must be positive")
    for name in ("refresh_cooldown", "contract_refresh_cooldown", "supply_ttl", "max_feed_age"):
        if getattr(settings, name) < 0:
            raise ValueError(f"metadata.{name} cannot be negative")
    if settings.token_refresh_interval < 60:
        raise ValueError("metadata.token_refresh_interval must be at least 60 seconds")
    if not 1024 <= settings.max_document_bytes <= 64 << 20:
        raise ValueError("metadata.max_document_bytes must be between 1 KiB and 64 MiB")
    if not 1 <= settings.fetch_concurrency <= 256:
        raise ValueError("metadata.fetch_concurrency must be between 1 and 256")
    if not settings.retry_schedule or any(d <= 0 for d in settings.retry_schedule):
        raise ValueError("metadata.retry_schedule must be positive delays, at least one")
    if settings.max_attempts < 1:
        raise ValueError("metadata.max_attempts must be at least 1")
    for token, feed in settings.price_feeds.items():
        _address(token, "a metadata.price_feeds key")
        _address(feed, f"metadata.price_feeds[{token}]")
    for feed, age in settings.feed_max_age.items():
        _address(feed, "a metadata.feed_max_age key")
        if age < 0:
            raise ValueError("metadata.feed_max_age values cannot be negative")
    if settings.native_price_feed:
        _address(settings.native_price_feed, "metadata.native_price_feed")
    if settings.multicall3:
        _address(settings.multicall3, "metadata.multicall3")
    if settings.token_list.startswith(("http:", "https:")):
        _url(settings.token_list, "metadata.token_list")


def manifest_feeds(manifest: Manifest | None) -> tuple[dict[str, str], str | None]:
    """Token address → feed address, and the native feed, as a devnet manifest names them."""
    if manifest is None:
        return {}, None
    feeds = {
        contract.address: manifest.address(contract.price_feed)
        for contract in manifest.of_kind("erc20").values()
        if contract.price_feed and contract.price_feed in manifest.contracts
    }
    native = manifest.native_price_feed
    return feeds, manifest.address(native) if native in manifest.contracts else None


def manifest_multicall(manifest: Manifest | None) -> str | None:
    if manifest is None:
        return None
    found = manifest.of_kind("multicall3")
    return next(iter(found.values())).address if found else None
