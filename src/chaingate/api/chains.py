"""``{chain}`` in a REST path: which configured network it names, and who may use it.

The REST paths name a chain but not a network (docs/decisions/gas.md, "Gas prices"):

* ``ethereum`` — the chain's ``mainnet`` when configured, else its only network; a chain
  with several networks and no mainnet must be named in full;
* ``ethereum-sepolia`` — chain and network, explicitly (any configured network).

Test keys may only reach networks configured ``testnet = true``, as on the RPC route.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from chaingate.api.errors import ApiError
from chaingate.config import NetworkSettings


class ChainNames:
    """Which network (``chain/network`` key) each accepted ``{chain}`` value names."""

    def __init__(self, keys: Iterable[str]) -> None:
        self.networks: dict[str, list[str]] = {}
        for key in sorted(keys):
            chain, network = key.split("/", 1)
            self.networks.setdefault(chain, []).append(network)
        full: dict[str, str | None] = {}
        for chain, networks in self.networks.items():
            for network in networks:
                alias = f"{chain}-{network}"
                # Two keys spelling the same alias ("a-b"/"c" and "a"/"b-c"): neither gets it.
                full[alias] = None if alias in full else f"{chain}/{network}"
        self.names: dict[str, str] = {a: key for a, key in full.items() if key is not None}
        for chain, networks in self.networks.items():
            default = self.default_network(networks)
            if default is not None:
                self.names[chain] = f"{chain}/{default}"  # a bare chain name wins
            else:
                self.names.pop(chain, None)

    @staticmethod
    def default_network(networks: list[str]) -> str | None:
        if "mainnet" in networks:
            return "mainnet"
        return networks[0] if len(networks) == 1 else None

    def resolve(self, name: str) -> str | None:
        return self.names.get(name)

    def name_of(self, key: str) -> str:
        """The shortest accepted name of a network."""
        chain = key.split("/", 1)[0]
        if self.names.get(chain) == key:
            return chain
        return next((a for a, k in sorted(self.names.items()) if k == key), key)

    def not_found(self, name: str, what: str) -> str:
        shown = name if len(name) <= 64 else name[:64] + "..."
        networks = self.networks.get(name)
        if networks and name not in self.names:
            choices = ", ".join(f"{name}-{n}" for n in networks)
            return f"chain {shown!r} has several networks: name one of {choices}"
        if not self.names:
            return f"{what} are not served for any chain on this deployment"
        return f"unknown chain {shown!r}: {what} are served for {', '.join(sorted(self.names))}"


class ChainResolver:
    """Resolves ``{chain}`` for a caller: 404 for an unknown name, 403 for a test key on a
    network that is not a testnet."""

    def __init__(self, networks: Mapping[str, NetworkSettings], what: str) -> None:
        self.networks = networks
        self.names = ChainNames(networks)
        self.what = what  # "gas prices", "token balances": for messages

    def resolve(self, name: str, principal: object) -> str:
        key = self.names.resolve(name)
        if key is None:
            raise ApiError(404, self.names.not_found(name, self.what))
        test_key = principal is not None and getattr(principal, "environment", "") == "test"
        if test_key and not self.networks[key].testnet:
            raise ApiError(
                403, f"test keys may only reach testnets; {key} is not one" + self._testnets_of(key)
            )
        return key

    def _testnets_of(self, key: str) -> str:
        chain = key.split("/", 1)[0]
        keys = [
            k for k, net in self.networks.items() if k.split("/", 1)[0] == chain and net.testnet
        ]
        if not keys:
            return ""
        names = ", ".join(self.names.name_of(k) for k in sorted(keys))
        return f" (testnets of {chain}: {names})"
