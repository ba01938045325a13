"""One network's ERC-4337 contracts and the chain reads the wallet subsystem makes there.

Addresses come from ``[chains.<chain>.<network>.wallets]``, else the devnet manifest, else
(EntryPoints and factories) the canonical mainnet addresses.  A factory's proxy code is
learned from the chain once and proven against its own ``getAddress`` (``chaingate.aa``)
before any wallet address is computed with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from decimal import Decimal

import trio

from chaingate.aa.accounts import AccountFactory, FactoryMismatch, learn_factory
from chaingate.aa.userop import MANIFEST_TAG as _TAG
from chaingate.aa.userop import Version, entry_point_address
from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.config import ConfigError, NetworkSettings
from chaingate.config.manifest import Manifest
from chaingate.config.network import Network
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address
from chaingate.metadata.multicall import Multicall
from chaingate.metadata.prices import PriceBook
from chaingate.metadata.settings import manifest_feeds
from chaingate.rpc.errors import UpstreamError

log = logging.getLogger("chaingate.wallets")

VERSIONS: tuple[Version, ...] = ("0.6", "0.7", "0.8")
CANONICAL_FACTORIES = {
    "0.6": "0x9406Cc6185a346906296840746125a0E44976454",
    "0.7": "0x91E60e0613810449d098b0b5Ec8b51A0FE8c8985",
    "0.8": "0x13E9ed32155810FDbd067D4522C492D6f68E5944",
}
# The code an EIP-7702 wallet delegates to: v0.8's Simple7702Account (its canonical address).
CANONICAL_DELEGATE = "0xe6Cae83BdE06E4c305530e199D7217f42808555B"


class Unavailable(Exception):
    """What the network cannot do now (a node that does not answer, a stale price feed); the
    message says which.  Worth retrying."""


class NotServed(Unavailable):
    """What this deployment does not offer on the network (no paymaster or signer, no
    account factory there): retrying will not help."""


def _from_manifest(manifest: Manifest | None, name: str) -> str | None:
    if manifest is None or name not in manifest.contracts:
        return None
    return manifest.address(name)


class WalletNetwork:
    def __init__(
        self,
        key: Network,
        settings: NetworkSettings,
        client: ChainClient,
        manifest: Manifest | None,
        *,
        clock: Callable[[], float],
    ) -> None:
        self.key = key
        self.chain, self.network = key.chain, key.network
        self.settings = settings.wallets
        self.client = client
        chain_id = settings.chain_id
        if chain_id is None and manifest is not None:
            chain_id = manifest.chain_id
        self.chain_id = chain_id
        wallets = settings.wallets
        self.entry_points: dict[Version, str] = {}
        self.factory_addresses: dict[Version, str] = {}
        self.paymasters: dict[Version, str] = {}
        for field in ("entry_points", "factories", "paymasters"):
            unknown = sorted(set(getattr(wallets, field)) - set(VERSIONS))
            if unknown:
                raise ConfigError(
                    f"chains.{self.chain}.{self.network}.wallets.{field}: keys are EntryPoint "
                    f"versions (0.6, 0.7, 0.8), not {', '.join(unknown)}"
                )
        if not 0 < wallets.paymaster_verification_gas < 1 << 64 or not (
            0 <= wallets.paymaster_post_op_gas < 1 << 64
        ):
            raise ConfigError(
                f"chains.{self.chain}.{self.network}.wallets: paymaster_verification_gas must "
                "be above 0 (the paymaster validates every operation), both below 2**64"
            )
        try:
            self.deposit_floor = int(wallets.deposit_floor)
        except ValueError:
            raise ConfigError(
                f"chains.{self.chain}.{self.network}.wallets.deposit_floor: expected wei as a "
                "decimal string"
            ) from None
        for version in VERSIONS:
            tag = _TAG[version]
            self.entry_points[version] = entry_point_address(
                wallets.entry_points, manifest, version
            )
            factory = (
                wallets.factories.get(version)
                or _from_manifest(manifest, f"simple_account_factory_{tag}")
                or CANONICAL_FACTORIES[version]
            )
            self.factory_addresses[version] = checksum_address(factory)
            paymaster = wallets.paymasters.get(version) or _from_manifest(
                manifest, f"verifying_paymaster_{tag}"
            )
            if paymaster:
                self.paymasters[version] = checksum_address(paymaster)
        self.delegate = checksum_address(
            wallets.delegate
            or _from_manifest(manifest, "simple_7702_account_v08")
            or CANONICAL_DELEGATE
        )
        _, native_feed = manifest_feeds(manifest)
        metadata = settings.metadata
        self.prices = PriceBook(
            Multicall(client, None),
            {},
            metadata.native_price_feed or native_feed,
            max_age=metadata.max_feed_age,
            feed_max_age=metadata.feed_max_age,
            ttl=metadata.price_ttl,
            clock=clock,
        )
        self._factories: dict[Version, AccountFactory] = {}
        self._factory_lock = trio.Lock()

    def version_of_entry_point(self, address: str) -> Version | None:
        for version, entry_point in self.entry_points.items():
            if entry_point.lower() == address.lower():
                return version
        return None

    async def factory(self, version: Version) -> AccountFactory:
        """The version's factory, learned and proven once (a failed proof is retried on the
        next request: the node may have been behind)."""
        known = self._factories.get(version)
        if known is not None:
            return known
        async with self._factory_lock:
            known = self._factories.get(version)
            if known is not None:
                return known
            address = self.factory_addresses[version]
            try:
                learned = await learn_factory(self.client, address, version)
            except FactoryMismatch as exc:
                log.error(
                    "account factory failed its proof",
                    extra={
                        "fields": {"network": str(self.key), "factory": address, "error": str(exc)}
                    },
                )
                raise NotServed(
                    f"the v{version} account factory {address} on {self.key} cannot be used: {exc}"
                ) from None
            except (UpstreamError, RpcCallError) as exc:
                raise Unavailable(f"{self.key}: the node did not answer ({exc})") from None
            self._factories[version] = learned
            return learned

    async def call(self, target: str, data: bytes) -> bytes:
        try:
            result = await self.client.call(
                "eth_call", [{"to": target, "data": "0x" + data.hex()}, "latest"]
            )
        except (UpstreamError, RpcCallError) as exc:
            raise Unavailable(f"{self.key}: the node did not answer ({exc})") from None
        if not isinstance(result, str) or not result.startswith("0x"):
            raise Unavailable(f"{self.key}: the node answered eth_call with {result!r}")
        return bytes.fromhex(result[2:])

    async def nonce(self, sender: str, version: Version) -> int:
        """EntryPoint ``getNonce(sender, 0)``."""
        data = await self.call(
            self.entry_points[version], abi.encode_call("getNonce(address,uint192)", sender, 0)
        )
        return self._uint(data, "EntryPoint.getNonce")

    async def paymaster_nonce(self, version: Version, sender: str) -> int:
        """The v0.6 VerifyingPaymaster's ``senderNonce(sender)``: part of what it signs."""
        data = await self.call(
            self.paymasters[version], abi.encode_call("senderNonce(address)", sender)
        )
        return self._uint(data, "VerifyingPaymaster.senderNonce")

    async def has_code(self, address: str) -> bool:
        try:
            code = await self.client.call("eth_getCode", [address, "latest"])
        except (UpstreamError, RpcCallError) as exc:
            raise Unavailable(f"{self.key}: the node did not answer ({exc})") from None
        return isinstance(code, str) and len(code) > 2

    async def deposit(self, version: Version) -> int | None:
        """The paymaster's EntryPoint deposit (wei), None without a paymaster."""
        paymaster = self.paymasters.get(version)
        if paymaster is None:
            return None
        data = await self.call(
            self.entry_points[version], abi.encode_call("balanceOf(address)", paymaster)
        )
        return self._uint(data, "EntryPoint.balanceOf")

    def _uint(self, data: bytes, what: str) -> int:
        """A uint256 answer; anything else (no contract there answers "0x") is Unavailable."""
        try:
            (value,) = abi.decode(["uint256"], data)
        except ValueError:
            raise NotServed(
                f"{what} on {self.key} answered {len(data)} bytes, not a uint256: is the "
                "contract deployed there?"
            ) from None
        return int(value)

    async def usd_per_eth(self) -> Decimal:
        """The native currency's USD price from its feed, fresh, or Unavailable."""
        quote = (await self.prices.quotes([None]))[None]
        if quote.price is None:
            raise Unavailable(
                f"no USD price of the native currency on {self.key}: {quote.error}"
                " (sponsorship needs one to apply USD rules)"
            )
        return quote.price
