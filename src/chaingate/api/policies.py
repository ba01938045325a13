"""Gas policies: ``POST /v1/gas/policies`` (the spec's), and beyond it ``GET`` (list and one,
with the policy's ledger of estimated versus settled spend), ``PATCH`` (name, rules, status
``active``/``paused``), ``DELETE`` and ``POST /v1/gas/policies/{id}/evaluate`` (a dry run: the
rule that would refuse an operation, nothing signed or reserved).

Rules are checked strictly (``chaingate.wallets.rules``): an unknown key, a wrong type or an
out-of-range value is 400 naming ``rules.<key>``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from chaingate.api.chains import ChainResolver
from chaingate.api.deps import ApiDeps
from chaingate.api.errors import ApiError
from chaingate.api.routing import Call, NoInput, RestApi
from chaingate.api.sponsor import SponsorOperation, to_user_operation
from chaingate.api.types import Address, ChainName, Paged25, UnixTime
from chaingate.api.wallets import iso
from chaingate.api.walletsupport import account_of, service_of, unavailable
from chaingate.config.network import Network
from chaingate.printable import first_unprintable
from chaingate.wallets.model import Evaluation, PolicyRefused
from chaingate.wallets.rules import RuleError, Rules, parse_rules, usd_text
from chaingate.wallets.store import Ledger, PolicyRow


class CreatePolicy(msgspec.Struct, forbid_unknown_fields=True):
    name: Any  # checked below: a message that names the field beats msgspec's
    chain: ChainName
    rules: dict[str, Any]


class UpdatePolicy(msgspec.Struct, forbid_unknown_fields=True):
    name: Any = None
    rules: dict[str, Any] | None = None
    status: Literal["active", "paused"] | None = None


class PolicyPath(msgspec.Struct, forbid_unknown_fields=True):
    id: str


class Spend(msgspec.Struct):
    """Estimated versus settled spend (USD): what was reserved when signing, what the
    EntryPoint charged for the operations that ran."""

    reserved_operations: int
    reserved_usd: str
    settled_operations: int
    settled_estimated_usd: str
    settled_usd: str
    released_operations: int


class GasPolicy(msgspec.Struct, omit_defaults=True):
    id: str
    name: str
    chain: str
    rules: Rules
    status: str
    created_at: str
    updated_at: str
    spend: Spend | None = None


class GasPolicyList(msgspec.Struct):
    policies: list[GasPolicy]
    page: int
    total: int
    limit: int


class DeletedPolicy(msgspec.Struct):
    id: str
    deleted: bool


class EvaluateBody(msgspec.Struct, forbid_unknown_fields=True):
    user_operation: SponsorOperation
    entry_point: Address | None = None


class EvaluationResult(msgspec.Struct):
    allowed: bool
    rule: str | None
    message: str | None
    sponsored_gas_usd: str | None
    entry_point_version: str | None


_rules_decoder = msgspec.json.Decoder(Rules)


def _name(value: object) -> str:
    if not isinstance(value, str) or not 1 <= len(value.strip()) <= 200:
        raise ApiError(400, "invalid field 'name': expected a string of 1 to 200 characters")
    char = first_unprintable(value)
    if char is not None:
        # Refused rather than stripped: what the client sees echoed is what it sent.
        raise ApiError(
            400, f"invalid field 'name': unprintable character U+{ord(char):04X} is not allowed"
        )
    return value.strip()


def _rules(raw: dict[str, Any]) -> Rules:
    try:
        return parse_rules(raw, parse_time=UnixTime.parse)
    except RuleError as exc:
        raise ApiError(400, f"invalid field {exc!s}") from None


def _spend(ledger: Ledger) -> Spend:
    return Spend(
        reserved_operations=ledger.reserved_operations,
        reserved_usd=usd_text(ledger.reserved_usd),
        settled_operations=ledger.settled_operations,
        settled_estimated_usd=usd_text(ledger.settled_estimated_usd),
        settled_usd=usd_text(ledger.settled_usd),
        released_operations=ledger.released_operations,
    )


def register(api: RestApi, deps: ApiDeps) -> None:
    _register_create_and_list(api, deps, ChainResolver(deps.evm_networks, "gas policies"))
    _register_one_policy(api, deps)
    _register_evaluate(api, deps)


def _policy(row: PolicyRow, ledger: Ledger | None = None) -> GasPolicy:
    return GasPolicy(
        id=row.id,
        name=row.name,
        chain=row.chain_label,
        rules=_rules_decoder.decode(row.rules),
        status=row.status,
        created_at=iso(row.created_at),
        updated_at=iso(row.updated_at),
        spend=_spend(ledger) if ledger is not None else None,
    )


async def _owned(deps: ApiDeps, call: Call[PolicyPath, Any, Any]) -> PolicyRow:
    """The caller's account's policy the path names, else 404."""
    row = await service_of(deps).store.get_policy(account_of(call.principal), call.path.id)
    if row is None:
        raise ApiError(404, f"no gas policy {call.path.id[:64]} in this account")
    return row


def _register_create_and_list(api: RestApi, deps: ApiDeps, chains: ChainResolver) -> None:
    @api.route(
        "POST",
        "/v1/gas/policies",
        name="createGasPolicy",
        summary="Create a gas policy: which operations the paymaster sponsors",
        access="gas:manage",
        body=CreatePolicy,
        response=GasPolicy,
        status=201,
        errors=(400, 403, 404, 503),
        tags=("gas",),
        description="Rules: `max_gas_usd` (per operation, worst case), "
        "`max_per_user_per_day` (operations per sender per UTC day), `allowed_contracts` and "
        "`allowed_methods` (selectors or signatures of every call inside the account's "
        "execute/executeBatch), `rate_limit` ({max_operations, interval_seconds}, whole "
        "policy); beyond the spec `valid_from`/`valid_until`, `max_total_usd`, "
        "`max_per_user_usd` and `budget_period` (day, week, month or never).",
    )
    async def create_policy(call: Call[NoInput, NoInput, CreatePolicy]) -> object:
        service = service_of(deps)
        body = call.body
        name = _name(body.name)
        rules = _rules(body.rules)
        key = chains.resolve(body.chain, call.principal)
        with unavailable():
            row = await service.create_policy(
                account_of(call.principal), name, key, body.chain, rules
            )
        return _policy(row)

    @api.route(
        "GET",
        "/v1/gas/policies",
        name="listGasPolicies",
        summary="The calling account's gas policies, oldest first",
        access="gas:manage",
        query=Paged25,
        response=GasPolicyList,
        errors=(400, 503),
        tags=("gas",),
    )
    async def list_policies(call: Call[NoInput, Paged25, None]) -> object:
        service = service_of(deps)
        rows, total = await service.store.list_policies(
            account_of(call.principal), offset=call.query.offset, limit=call.query.limit
        )
        return GasPolicyList(
            policies=[_policy(r) for r in rows],
            page=call.query.page,
            total=total,
            limit=call.query.limit,
        )


def _register_one_policy(api: RestApi, deps: ApiDeps) -> None:
    @api.route(
        "GET",
        "/v1/gas/policies/{id}",
        name="getGasPolicy",
        summary="One gas policy, with its spend: reserved, settled (estimated and actual)",
        access="gas:manage",
        path_params=PolicyPath,
        response=GasPolicy,
        errors=(404, 503),
        tags=("gas",),
    )
    async def get_policy(call: Call[PolicyPath, NoInput, None]) -> object:
        row = await _owned(deps, call)
        return _policy(row, await service_of(deps).ledger(row.id))

    @api.route(
        "PATCH",
        "/v1/gas/policies/{id}",
        name="updateGasPolicy",
        summary="Rename a gas policy, replace its rules, or pause and resume it",
        access="gas:manage",
        path_params=PolicyPath,
        body=UpdatePolicy,
        response=GasPolicy,
        errors=(400, 404, 503),
        tags=("gas",),
        description="`rules` replaces the whole rules object. A paused policy refuses every "
        "sponsorship (rule `status`); sponsorships already signed stay valid on chain.",
    )
    async def update_policy(call: Call[PolicyPath, NoInput, UpdatePolicy]) -> object:
        service = service_of(deps)
        body = call.body
        changes: dict[str, Any] = {}
        if body.name is not None:
            changes["name"] = _name(body.name)
        if body.rules is not None:
            changes["rules"] = msgspec.json.encode(_rules(body.rules)).decode()
        if body.status is not None:
            changes["status"] = body.status
        account = account_of(call.principal)
        if not changes:
            row = await _owned(deps, call)
        else:
            found = await service.store.update_policy(
                account, call.path.id, changes, int(service.clock() * 1000)
            )
            if found is None:
                raise ApiError(404, f"no gas policy {call.path.id[:64]} in this account")
            row = found
        return _policy(row)

    @api.route(
        "DELETE",
        "/v1/gas/policies/{id}",
        name="deleteGasPolicy",
        summary="Delete a gas policy and its ledger (permanent)",
        access="gas:manage",
        path_params=PolicyPath,
        response=DeletedPolicy,
        errors=(404, 503),
        tags=("gas",),
    )
    async def delete_policy(call: Call[PolicyPath, NoInput, None]) -> object:
        service = service_of(deps)
        if not await service.store.delete_policy(account_of(call.principal), call.path.id):
            raise ApiError(404, f"no gas policy {call.path.id[:64]} in this account")
        return DeletedPolicy(id=call.path.id, deleted=True)


def _register_evaluate(api: RestApi, deps: ApiDeps) -> None:
    @api.route(
        "POST",
        "/v1/gas/policies/{id}/evaluate",
        name="evaluateGasPolicy",
        summary="Dry run: would the policy sponsor this operation, and if not, which rule "
        "refuses it",
        access="gas:manage",
        path_params=PolicyPath,
        body=EvaluateBody,
        response=EvaluationResult,
        errors=(400, 404, 503),
        tags=("gas",),
        description="Every rule is evaluated as `POST /v1/gas/sponsor` would, counts "
        "included; nothing is signed or reserved.",
    )
    async def evaluate(call: Call[PolicyPath, NoInput, EvaluateBody]) -> object:
        service = service_of(deps)
        row = await _owned(deps, call)
        op = to_user_operation(call.body.user_operation)
        key = Network(row.chain, row.network)
        with unavailable():
            try:
                outcome = await service.sponsor(
                    account_of(call.principal),
                    key,
                    row.id,
                    op,
                    call.body.entry_point,
                    dry_run=True,
                )
            except PolicyRefused as exc:  # a refusal before the counts: the same answer
                outcome = Evaluation(exc.refusal, None, None)
        assert isinstance(outcome, Evaluation)
        refusal = outcome.refusal
        return EvaluationResult(
            allowed=refusal is None,
            rule=refusal.rule if refusal else None,
            message=refusal.message if refusal else None,
            sponsored_gas_usd=usd_text(outcome.usd) if outcome.usd is not None else None,
            entry_point_version=outcome.version,
        )
