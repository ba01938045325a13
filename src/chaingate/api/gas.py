"""``GET /v1/gas/{chain}/prices`` — the newest gas estimate of a network, from memory.

Names resolve over every configured EVM network, followed or not (``chaingate.api.chains``):
``ethereum`` means the mainnet whenever one is configured, so a deployment that does not follow
its mainnet answers 404 for it — never another network's prices.

The scope (``data:read``) is the edge's check; test keys are refused on networks that are
not testnets, like on the RPC route.  The body was encoded by the network's oracle when the
head arrived: a request costs a dictionary lookup, never an upstream call.
"""

from __future__ import annotations

import math

import msgspec

from chaingate.api.chains import ChainResolver
from chaingate.api.deps import ApiDeps
from chaingate.api.errors import ApiError
from chaingate.api.routing import Call, NoInput, RestApi
from chaingate.api.types import ChainName
from chaingate.gas.prices import GasEstimate


class GasPath(msgspec.Struct, forbid_unknown_fields=True):
    chain: ChainName


def register(api: RestApi, deps: ApiDeps) -> None:
    chains = ChainResolver(deps.evm_networks, "gas prices")
    oracles = deps.gas_oracles

    @api.route(
        "GET",
        "/v1/gas/{chain}/prices",
        name="getGasPrices",
        summary="Gas price estimates (slow, standard, fast) of a chain",
        access="data:read",
        path_params=GasPath,
        response=GasEstimate,
        errors=(403, 404, 503),
        tags=("gas",),
        description="Recomputed on every new block from `eth_feeHistory`; answered from "
        "memory. `503` (with `Retry-After`) until the first estimate exists.",
    )
    async def get_gas_prices(call: Call[GasPath, NoInput, None]) -> object:
        key = chains.resolve(call.path.chain, call.principal)
        oracle = oracles.get(key)
        if oracle is None:
            raise ApiError(
                404,
                f"gas prices are not computed for {key}: its chain follower is off "
                "([chains.<chain>.<network>.follower] enabled = false)",
            )
        body = oracle.body
        if body is None:
            raise ApiError(
                503,
                f"no gas estimate for {oracle.label} yet: retry after the next block",
                headers={"Retry-After": str(max(1, math.ceil(oracle.settings.block_time)))},
            )
        return msgspec.Raw(body)
