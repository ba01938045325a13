"""``POST /v1/wallets/create``, ``GET /v1/wallets/{address}``, ``GET /v1/wallets``.

A wallet is a SimpleAccount (EntryPoint v0.7 by default; ``entry_point_version`` "0.6" or
"0.8" beyond the spec), or — ``eip7702: true``, beyond the spec — the owner's own EOA as an
EIP-7702 account of v0.8, delegating to the network's Simple7702Account (``factory`` names
that code; ``deployed`` while the EOA is delegated to it, ``deploy_tx`` the transaction that
delegated it, whoever sent it); a SimpleAccount is at the address its factory would deploy
it to for (owner, salt): computed here, proven against the factory's own ``getAddress``.
Creating the same wallet again answers 200 with the stored one (the first creation 201).
Each account sees only its own wallets; two accounts creating the same (owner, salt) both
hold it — the owner key, not the record, controls a wallet.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

import msgspec

from chaingate.api.chains import ChainResolver
from chaingate.api.deps import ApiDeps
from chaingate.api.errors import ApiError
from chaingate.api.responses import json_response
from chaingate.api.routing import Call, NoInput, RestApi
from chaingate.api.types import Address, ChainName, Paged25, Uint256
from chaingate.api.walletsupport import account_of, service_of, unavailable
from chaingate.config.network import Network
from chaingate.wallets.store import WalletRow


class CreateWallet(msgspec.Struct, forbid_unknown_fields=True):
    owner: Address
    chain: ChainName
    salt: Uint256 | None = None  # 0
    entry_point_version: Literal["0.6", "0.7", "0.8"] | None = None
    eip7702: bool = False


class Wallet(msgspec.Struct, omit_defaults=True):
    address: Address
    owner: Address
    chain: str
    status: Literal["counterfactual", "deployed"]
    factory: Address
    created_at: str
    entry_point_version: str
    salt: str
    account_type: Literal["simple", "eip7702"] = "simple"
    nonce: int | None = None
    deployed_at: str | None = None
    deploy_tx: str | None = None


class WalletSummary(msgspec.Struct):
    address: Address
    owner: Address
    chain: str
    status: Literal["counterfactual", "deployed"]
    created_at: str


class WalletList(msgspec.Struct):
    wallets: list[WalletSummary]
    page: int
    total: int
    limit: int


class WalletPath(msgspec.Struct, forbid_unknown_fields=True):
    address: Address


class WalletQuery(msgspec.Struct, forbid_unknown_fields=True):
    chain: ChainName | None = None


class ListQuery(Paged25, forbid_unknown_fields=True):
    chain: ChainName | None = None


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _status(row: WalletRow) -> Literal["counterfactual", "deployed"]:
    return "deployed" if row.deploy_tx is not None else "counterfactual"


def register(api: RestApi, deps: ApiDeps) -> None:
    chains = ChainResolver(deps.evm_networks, "smart wallets")
    _register_create(api, deps, chains)
    _register_reads(api, deps, chains)


def _wallet(chains: ChainResolver, row: WalletRow, *, nonce: int | None = None) -> Wallet:
    deployed = row.deploy_tx is not None
    return Wallet(
        address=Address.of(row.address),
        owner=Address.of(row.owner),
        chain=chains.names.name_of(Network(row.chain, row.network)),
        status=_status(row),
        factory=Address.of(row.factory),
        created_at=iso(row.created_at),
        entry_point_version=row.version,
        salt=row.salt,
        account_type="eip7702" if row.kind == "eip7702" else "simple",
        nonce=nonce,
        deployed_at=iso(row.deployed_at) if deployed and row.deployed_at else None,
        deploy_tx=row.deploy_tx if deployed else None,
    )


def _register_create(api: RestApi, deps: ApiDeps, chains: ChainResolver) -> None:
    @api.route(
        "POST",
        "/v1/wallets/create",
        name="createWallet",
        summary="Create a smart wallet (its counterfactual address; nothing is deployed)",
        access="wallets:manage",
        body=CreateWallet,
        response=Wallet,
        status=201,
        errors=(400, 403, 404, 503),
        other_responses={200: Wallet},  # the same wallet, created before
        tags=("wallets",),
        description="A SimpleAccount of EntryPoint v0.7 (or `entry_point_version` 0.6) owned "
        "by `owner`, at the address its factory's CREATE2 gives for (owner, salt). `salt` is "
        "a decimal or 0x-hex uint256 (default 0). The same request again answers 200 with the "
        "wallet already created. It becomes `deployed` when its first operation runs. "
        "`eip7702: true` (EntryPoint v0.8): the owner's own address as an EIP-7702 account, "
        "`deployed` once a delegation to the network's Simple7702Account lands on chain.",
    )
    async def create_wallet(call: Call[NoInput, NoInput, CreateWallet]) -> object:
        service = service_of(deps)
        body = call.body
        key = chains.resolve(body.chain, call.principal)
        with unavailable():
            row, created = await service.create_wallet(
                account_of(call.principal),
                key,
                body.owner,
                int(body.salt or 0),
                body.entry_point_version,
                eip7702=body.eip7702,
            )
        return json_response(_wallet(chains, row), 201 if created else 200)


def _register_reads(api: RestApi, deps: ApiDeps, chains: ChainResolver) -> None:
    @api.route(
        "GET",
        "/v1/wallets/{address}",
        name="getWallet",
        summary="One smart wallet of the calling account, with its nonce and deployment",
        access="wallets:manage",
        path_params=WalletPath,
        query=WalletQuery,
        response=Wallet,
        errors=(400, 404, 503),
        tags=("wallets",),
        description="`nonce` is the EntryPoint's `getNonce(wallet, 0)`. A wallet created on "
        "several chains: name one with `chain` (else the first created is shown).",
    )
    async def get_wallet(call: Call[WalletPath, WalletQuery, None]) -> object:
        service = service_of(deps)
        rows = await service.store.get_wallet(account_of(call.principal), call.path.address.lower())
        if call.query.chain is not None:
            key = chains.resolve(call.query.chain, call.principal)
            rows = [r for r in rows if Network(r.chain, r.network) == key]
        if not rows:
            raise ApiError(404, f"no wallet {call.path.address} in this account")
        row = rows[0]
        with unavailable():
            nonce = await service.nonce(row)
        return _wallet(chains, row, nonce=nonce)

    @api.route(
        "GET",
        "/v1/wallets",
        name="listWallets",
        summary="The calling account's smart wallets, oldest first",
        access="wallets:manage",
        query=ListQuery,
        response=WalletList,
        errors=(400, 404),
        tags=("wallets",),
    )
    async def list_wallets(call: Call[NoInput, ListQuery, None]) -> object:
        service = service_of(deps)
        query = call.query
        network = None
        if query.chain is not None:
            key = chains.resolve(query.chain, call.principal)
            network = (key.chain, key.network)
        rows, total = await service.store.list_wallets(
            account_of(call.principal), network, offset=query.offset, limit=query.limit
        )
        return WalletList(
            wallets=[
                WalletSummary(
                    address=Address.of(r.address),
                    owner=Address.of(r.owner),
                    chain=chains.names.name_of(Network(r.chain, r.network)),
                    status=_status(r),
                    created_at=iso(r.created_at),
                )
                for r in rows
            ],
            page=query.page,
            total=total,
            limit=query.limit,
        )
