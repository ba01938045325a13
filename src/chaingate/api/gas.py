"""``GET /v1/gas/{chain}/prices`` — the newest gas estimate of a network, from memory.

The path names a chain but not a network (docs/decisions.md, "Gas prices"):

* ``ethereum`` — the chain's ``mainnet`` when configured, else its only network; a chain
  with several networks and no mainnet must be named in full;
* ``ethereum-sepolia`` — chain and network, explicitly (any configured network).

Names resolve over every configured EVM network, followed or not: ``ethereum`` means the
mainnet whenever one is configured, so a deployment that does not follow its mainnet answers
404 for it — never another network's prices.

The scope (``data:read``) is the edge's check; test keys are refused on networks that are
not testnets, like on the RPC route.  The body was encoded by the network's oracle when the
head arrived: a request costs a dictionary lookup, never an upstream call.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from chaingate.api.app import error_response
from chaingate.config import NetworkSettings
from chaingate.gas.oracle import GasOracle


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

    def not_found(self, name: str) -> str:
        shown = name if len(name) <= 64 else name[:64] + "..."
        networks = self.networks.get(name)
        if networks and name not in self.names:
            choices = ", ".join(f"{name}-{n}" for n in networks)
            return f"chain {shown!r} has several networks: name one of {choices}"
        if not self.names:
            return "gas prices are not served for any chain on this deployment"
        return f"unknown chain {shown!r}: gas prices are served for {', '.join(sorted(self.names))}"


def register(
    app: QuartTrio,
    oracles: Mapping[str, GasOracle],
    networks: Mapping[str, NetworkSettings] | None = None,
) -> None:
    """``networks``: every configured EVM network (``chain/network`` keys); names resolve
    over all of them, and a network without an oracle (not followed) answers 404."""
    if networks is None:
        networks = {key: oracle.settings for key, oracle in oracles.items()}
    names = ChainNames(networks)

    def testnets_of(chain: str) -> str:
        keys = [k for k, net in networks.items() if k.split("/", 1)[0] == chain and net.testnet]
        if not keys:
            return ""
        return f" (testnets of {chain}: {', '.join(names.name_of(k) for k in sorted(keys))})"

    @app.get("/v1/gas/<chain>/prices")
    async def get_gas_prices(chain: str) -> Response:
        key = names.resolve(chain)
        if key is None:
            return error_response(404, names.not_found(chain))
        principal: Any = request.scope.get("chaingate.principal")
        test_key = principal is not None and principal.environment == "test"
        if test_key and not networks[key].testnet:
            return error_response(
                403,
                f"test keys may only reach testnets; {key} is not one"
                + testnets_of(key.split("/", 1)[0]),
            )
        oracle = oracles.get(key)
        if oracle is None:
            return error_response(
                404,
                f"gas prices are not computed for {key}: its chain follower is off "
                "([chains.<chain>.<network>.follower] enabled = false)",
            )
        body = oracle.body
        if body is None:
            response = error_response(
                503, f"no gas estimate for {oracle.label} yet: retry after the next block"
            )
            response.headers["Retry-After"] = str(max(1, math.ceil(oracle.settings.block_time)))
            return response
        return Response(body, status=200, mimetype="application/json")
