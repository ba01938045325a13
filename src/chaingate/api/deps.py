"""What the REST resources read from: the services the gateway built, handed over in one
object.  Every field may be empty (a deployment without keys has no store; OpenAPI generation
has nothing at all): the routes are the same, and a resource without its service answers with
a clear error instead of a different API."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chaingate.config import NetworkSettings
from chaingate.config.network import Network
from chaingate.gas.oracle import GasOracle


@dataclass
class ApiDeps:
    # The gateway's health report (``GET /v1/health``).
    health: Callable[[], dict[str, Any]] = lambda: {"status": "ok", "networks": []}
    # The store (None when API keys are off and nothing is followed).
    store: Any = None
    # Every configured EVM network, followed or not.
    evm_networks: Mapping[Network, NetworkSettings] = field(default_factory=dict)
    # Gas oracles of the followed networks.
    gas_oracles: Mapping[Network, GasOracle] = field(default_factory=dict)
    # The token/NFT index of each indexed network (chaingate.data.reader.IndexReader).
    indexes: Mapping[Network, Any] = field(default_factory=dict)
    # Token and NFT metadata of each indexed network (chaingate.metadata.MetadataService).
    metadata: Mapping[Network, Any] = field(default_factory=dict)
    # Smart wallets, gas policies and sponsorship (chaingate.wallets.WalletService).
    wallets: Any = None
    # Signed webhooks (chaingate.webhooks.WebhookService).
    webhooks: Any = None
    # Transaction simulation (chaingate.simulation.SimulationService).
    simulation: Any = None
