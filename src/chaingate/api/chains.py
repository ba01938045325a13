"""``{chain}`` in a REST path: which configured network it names, and who may use it.

The REST paths name a chain but not a network (docs/decisions/gas.md, "Gas prices"): the
names are ``Network``'s REST spelling (``chaingate.config.network.NetworkNames``).

Test keys may only reach networks configured ``testnet = true``, as on the RPC route.
"""

from __future__ import annotations

from collections.abc import Mapping

from chaingate.api.errors import ApiError
from chaingate.config import NetworkSettings
from chaingate.config.network import Network, NetworkNames


class ChainNames(NetworkNames):
    """Which network each accepted ``{chain}`` value names, and what to say when none."""

    def not_found(self, name: str, what: str) -> str:
        shown = name if len(name) <= 64 else name[:64] + "..."
        networks = self.networks.get(name)
        if networks and name not in self.names:
            choices = ", ".join(net.alias for net in networks)
            return f"chain {shown!r} has several networks: name one of {choices}"
        if not self.names:
            return f"{what} are not served for any chain on this deployment"
        return f"unknown chain {shown!r}: {what} are served for {', '.join(sorted(self.names))}"


class ChainResolver:
    """Resolves ``{chain}`` for a caller: 404 for an unknown name, 403 for a test key on a
    network that is not a testnet."""

    def __init__(self, networks: Mapping[Network, NetworkSettings], what: str) -> None:
        self.networks = networks
        self.names = ChainNames(networks)
        self.what = what  # "gas prices", "token balances": for messages

    def resolve(self, name: str, principal: object) -> Network:
        key = self.names.resolve(name)
        if key is None:
            raise ApiError(404, self.names.not_found(name, self.what))
        test_key = principal is not None and getattr(principal, "environment", "") == "test"
        if test_key and not self.networks[key].testnet:
            raise ApiError(
                403, f"test keys may only reach testnets; {key} is not one" + self._testnets_of(key)
            )
        return key

    def _testnets_of(self, key: Network) -> str:
        keys = [k for k, net in self.networks.items() if k.chain == key.chain and net.testnet]
        if not keys:
            return ""
        names = ", ".join(self.names.name_of(k) for k in sorted(keys))
        return f" (testnets of {key.chain}: {names})"
