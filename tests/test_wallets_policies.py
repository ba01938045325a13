"""Gas policies over HTTP, against the devnet gateway of ``tests/test_wallets_api.py``: each
rule refuses exactly what it should (status, envelope, the rule named) and lets through what
it should; policy CRUD; bad input is 400 naming the field, never 500; the evaluate dry run
reserves nothing; 50 concurrent sponsorships against a policy with 10 left give exactly 10.

Time-bound rules run on an injected clock (``WalletService.clock``), so UTC midnight and
interval edges are crossed exactly.  Costs are checked against an independent computation
(every gas limit x maxFeePerGas x the devnet's ETH/USD price).
"""

from __future__ import annotations

import re
import secrets
from decimal import ROUND_CEILING, Decimal
from typing import Any

import httpx
import pytest
import trio
from eth_account import Account

from chaingate.devnet.demo import ETH_USD_NOW
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address
from tests.test_wallets_api import (
    GWEI,
    TAG,
    Api,
    api,
    chain,
    execute,
    factory_address,
    operation,
)

__all__ = ["api", "chain"]  # fixtures, imported for pytest

APPROVE = "approve(address,uint256)"
TRANSFER = "transfer(address,uint256)"
# A UTC midnight in the future: the injected clock crosses it.
MIDNIGHT = 1_900_000_000 // 86400 * 86400 + 86400
SPEND_ZERO = {
    "reserved_operations": 0,
    "reserved_usd": "0",
    "settled_operations": 0,
    "settled_estimated_usd": "0",
    "settled_usd": "0",
    "released_operations": 0,
}


# --- helpers ---------------------------------------------------------------------------------


async def new_wallet(api: Api, version: str = "0.7", who: str = "a") -> str:
    owner = Account.create().address
    response = await api.request(
        "POST",
        "/v1/wallets/create",
        {
            "owner": owner,
            "chain": "ethereum",
            "salt": str(secrets.randbits(64)),
            "entry_point_version": version,
        },
        who=who,
    )
    assert response.status_code == 201, response.text
    address: str = response.json()["address"]
    return address


async def sponsor(
    api: Api, policy: str, op: dict[str, Any], who: str = "a", **extra: Any
) -> httpx.Response:
    body = {"chain": "ethereum", "policy_id": policy, "user_operation": op, **extra}
    return await api.request("POST", "/v1/gas/sponsor", body, who=who)


async def evaluate(
    api: Api, policy: str, op: dict[str, Any], who: str = "a", **extra: Any
) -> dict[str, Any]:
    response = await api.request(
        "POST", f"/v1/gas/policies/{policy}/evaluate", {"user_operation": op, **extra}, who=who
    )
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def spend(api: Api, policy: str) -> dict[str, Any]:
    response = await api.request("GET", f"/v1/gas/policies/{policy}")
    assert response.status_code == 200, response.text
    ledger: dict[str, Any] = response.json()["spend"]
    return ledger


def ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def refused(response: httpx.Response, status: int, policy: str, rule: str) -> str:
    """A policy's refusal: the status, the spec's envelope, the policy and the rule named."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    code = {403: "forbidden", 429: "rate_limited"}[status]
    assert set(error) == {"code", "message", "status"}, error
    assert error["code"] == code and error["status"] == status, error
    message: str = error["message"]
    assert re.fullmatch(
        rf"gas policy {re.escape(policy)}( refuses)?: rule {re.escape(rule)}: \S.*", message
    ), message
    if status == 429:
        assert int(response.headers["Retry-After"]) >= 1
    else:
        assert "Retry-After" not in response.headers
    return message


def invalid(response: httpx.Response, *named: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["status"] == 400, error
    message: str = error["message"]
    for fragment in named:
        assert fragment in message, message
    return message


def not_found(response: httpx.Response) -> None:
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["code"] == "not_found" and error["status"] == 404, error


def fake_clock(api: Api, start: float) -> list[float]:
    """The service's clock, set by writing ``now[0]``."""
    now = [start]
    assert api.gateway.wallets is not None
    api.gateway.wallets.clock = lambda: now[0]
    return now


def usd_micros(text: str) -> int:
    return int(Decimal(text) * 1_000_000)


def usd(micros: int) -> str:
    """Micro-dollars as the API writes them (no trailing zeros)."""
    text = f"{Decimal(micros) / 1_000_000:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def expected_usd(op: dict[str, Any], version: str) -> int:
    """The worst case priced independently: every gas limit (v0.7: with the network's
    default paymaster limits 100,000 + 0; v0.6: verification x 3) x maxFeePerGas x ETH/USD,
    in micro-dollars rounded up."""
    g = {k: int(op[k], 16) for k in op if k.endswith(("GasLimit", "Gas", "PerGas"))}
    if version == "0.6":
        gas = g["callGasLimit"] + 3 * g["verificationGasLimit"] + g["preVerificationGas"]
    else:
        gas = g["callGasLimit"] + g["verificationGasLimit"] + g["preVerificationGas"] + 100_000
    dollars = Decimal(gas * g["maxFeePerGas"]) * Decimal(str(ETH_USD_NOW)) / Decimal(10**18)
    return int((dollars * 1_000_000).to_integral_value(rounding=ROUND_CEILING))


def approve_call(api: Api) -> bytes:
    token = api.manifest.address("erc20_cgt")
    return execute(token, abi.encode_call(APPROVE, api.manifest.accounts[1], 5))


def batch(version: str, calls: list[tuple[str, bytes]]) -> bytes:
    targets = [t for t, _ in calls]
    data = [d for _, d in calls]
    if version == "0.6":
        return abi.encode_call("executeBatch(address[],bytes[])", targets, data)
    return abi.encode_call(
        "executeBatch(address[],uint256[],bytes[])", targets, [0] * len(calls), data
    )


# --- each rule -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_allowed_contracts_checks_every_inner_call(api: Api, version: str) -> None:
    token = api.manifest.address("erc20_cgt")
    other = api.manifest.address("erc721_collection")
    approve = abi.encode_call(APPROVE, api.manifest.accounts[1], 5)
    policy = await api.policy({"allowed_contracts": [token.lower()]})
    sender = await new_wallet(api, version)

    answer = ok(await sponsor(api, policy, operation(sender, execute(token, approve))))
    assert answer["entryPoint"] == api.manifest.address(f"entry_point_v0{version[-1]}")
    ok(await sponsor(api, policy, operation(sender, batch(version, [(token, approve)] * 2))))

    message = refused(
        await sponsor(api, policy, operation(sender, execute(other, approve))),
        403,
        policy,
        "allowed_contracts",
    )
    assert f"the call targets {other}, which is not allowed" in message
    # Hidden as the second call of a batch.
    hidden = batch(version, [(token, approve), (other, approve)])
    message = refused(
        await sponsor(api, policy, operation(sender, hidden)), 403, policy, "allowed_contracts"
    )
    assert f"call 2 of 2 targets {other}" in message
    # The other version's batch (the account would revert) and junk callData: what the
    # operation calls cannot be told, which this rule refuses.
    foreign = batch("0.7" if version == "0.6" else "0.6", [(token, approve)])
    for call_data in (foreign, b"\xde\xad\xbe\xef" + bytes(64)):
        message = refused(
            await sponsor(api, policy, operation(sender, call_data)),
            403,
            policy,
            "allowed_contracts",
        )
        assert "cannot tell what the operation calls" in message
    assert (await spend(api, policy))["reserved_operations"] == 2


def deploying(version: str, sender: str, call_data: bytes, factory: str, data: bytes) -> Any:
    """An operation that deploys its account through ``factory`` (v0.6: initCode)."""
    if version == "0.6":
        return operation(sender, call_data, initCode="0x" + factory[2:] + data.hex())
    return operation(sender, call_data, factory=factory, factoryData="0x" + data.hex())


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_allowed_contracts_covers_the_factory(api: Api, version: str) -> None:
    # Issue 25, item 3: the factory's code runs in validation at the paymaster's expense.
    token = api.manifest.address("erc20_cgt")
    rogue = checksum_address(api.manifest.address("erc721_collection"))  # any contract
    approve = execute(token, abi.encode_call(APPROVE, api.manifest.accounts[1], 5))
    owner, salt = Account.create().address, secrets.randbits(64)
    ours = api.manifest.address(f"simple_account_factory_{TAG[version]}")
    create = abi.encode_call("createAccount(address,uint256)", owner, salt)
    sender = factory_address(api, version, owner, salt)  # no code yet
    entry = {"entry_point": api.manifest.address(f"entry_point_{TAG[version]}")}
    policy = await api.policy({"allowed_contracts": [token]})

    # Another contract as the factory, with any data: refused, before any signature.
    junk = abi.encode_call("setApprovalForAll(address,bool)", api.manifest.accounts[2], True)
    op = deploying(version, sender, approve, rogue, junk)
    message = refused(await sponsor(api, policy, op, **entry), 403, policy, "allowed_contracts")
    assert f"deploys its account through {rogue}, which is neither" in message
    verdict = await evaluate(api, policy, op, **entry)
    assert (verdict["allowed"], verdict["rule"]) == (False, "allowed_contracts")
    # The network's account factory needs no listing; a factory the policy lists passes.
    good = deploying(version, sender, approve, ours, create)
    assert ok(await sponsor(api, policy, good, **entry))["entryPoint"] == entry["entry_point"]
    listed = await api.policy({"allowed_contracts": [token, rogue]})
    ok(await sponsor(api, listed, op, **entry))
    # Without an allowlist nothing about targets is restricted, the factory included.
    ok(await sponsor(api, await api.policy({}), op, **entry))
    assert (await spend(api, policy))["reserved_operations"] == 1


@pytest.mark.parametrize(
    "method", [APPROVE, "approve(address, uint256)", "0x095ea7b3", "0x095EA7B3"]
)
async def test_allowed_methods_by_signature_and_selector(api: Api, method: str) -> None:
    token = api.manifest.address("erc20_cgt")
    policy = await api.policy({"allowed_methods": [method]})
    sender = await new_wallet(api)
    spender = api.manifest.accounts[1]
    ok(await sponsor(api, policy, operation(sender, approve_call(api))))
    ok(
        await sponsor(
            api,
            policy,
            operation(sender, batch("0.7", [(token, abi.encode_call(APPROVE, spender, 1))] * 3)),
        )
    )
    transfer = abi.encode_call(TRANSFER, spender, 1)
    message = refused(
        await sponsor(api, policy, operation(sender, execute(token, transfer))),
        403,
        policy,
        "allowed_methods",
    )
    assert f"calls method 0x{abi.selector(TRANSFER).hex()}, not allowed" in message
    mixed = batch("0.7", [(token, abi.encode_call(APPROVE, spender, 1)), (token, transfer)])
    message = refused(
        await sponsor(api, policy, operation(sender, mixed)), 403, policy, "allowed_methods"
    )
    assert "call 2 of 2 calls method" in message
    # A plain transfer of value calls no method at all.
    message = refused(
        await sponsor(api, policy, operation(sender, execute(spender))),
        403,
        policy,
        "allowed_methods",
    )
    assert "calls no method" in message
    # callData no SimpleAccount accepts: what it calls cannot be told, which this rule refuses.
    message = refused(
        await sponsor(api, policy, operation(sender, b"\x01\x02\x03")),
        403,
        policy,
        "allowed_methods",
    )
    assert "cannot tell what the operation calls" in message


@pytest.mark.parametrize("method", ["approve(address,uint)", "approve(addr,uint256)"])
async def test_a_non_canonical_method_signature_is_refused_or_canonicalised(
    api: Api, method: str
) -> None:
    response = await api.request("POST", "/v1/gas/policies", with_rules(allowed_methods=[method]))
    if response.status_code == 400:
        invalid(response, "rules.allowed_methods[0]")
        return
    assert response.status_code == 201, response.text
    assert response.json()["rules"]["allowed_methods"] == [APPROVE]


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_max_gas_usd_between_two_worst_cases(api: Api, version: str) -> None:
    sender = await new_wallet(api, version)
    cheap = operation(sender, approve_call(api))
    dear = operation(sender, approve_call(api), callGasLimit=hex(2_000_000))
    unlimited = await api.policy({})
    cheap_usd = ok(await sponsor(api, unlimited, cheap))["sponsored_gas_usd"]
    dear_usd = (await evaluate(api, unlimited, dear))["sponsored_gas_usd"]
    assert usd_micros(cheap_usd) == expected_usd(cheap, version)
    assert usd_micros(dear_usd) == expected_usd(dear, version)
    assert usd_micros(cheap_usd) < usd_micros(dear_usd)

    between = usd((usd_micros(cheap_usd) + usd_micros(dear_usd)) // 2)
    policy = await api.policy({"max_gas_usd": between})
    assert ok(await sponsor(api, policy, cheap))["sponsored_gas_usd"] == cheap_usd
    message = refused(await sponsor(api, policy, dear), 403, policy, "max_gas_usd")
    assert f"up to ${dear_usd} in gas, over the policy's ${between}" in message
    # The limit itself is allowed; a micro-dollar less is not.
    exact = await api.policy({"max_gas_usd": cheap_usd})
    ok(await sponsor(api, exact, cheap))
    below = await api.policy({"max_gas_usd": usd(usd_micros(cheap_usd) - 1)})
    refused(await sponsor(api, below, cheap), 403, below, "max_gas_usd")
    # Raising a fee raises the worst case just as much.
    pricier = operation(sender, approve_call(api), maxFeePerGas=hex(30 * GWEI))
    refused(await sponsor(api, policy, pricier), 403, policy, "max_gas_usd")


async def test_max_per_user_per_day_across_utc_midnight(api: Api) -> None:
    now = fake_clock(api, MIDNIGHT - 10)  # 23:59:50 UTC
    policy = await api.policy({"max_per_user_per_day": 2})
    alice, bob = await new_wallet(api), await new_wallet(api)
    op = operation(alice, approve_call(api))
    ok(await sponsor(api, policy, op))
    ok(await sponsor(api, policy, op))
    third = await sponsor(api, policy, op)
    message = refused(third, 429, policy, "max_per_user_per_day")
    assert third.headers["Retry-After"] == "10"  # the seconds to midnight
    assert "2 operations sponsored today (UTC)" in message
    now[0] = MIDNIGHT - 1
    assert (await sponsor(api, policy, op)).headers["Retry-After"] == "1"
    # Per sender: another one is not limited by the first.
    ok(await sponsor(api, policy, operation(bob, approve_call(api))))

    now[0] = MIDNIGHT  # 00:00:00 UTC: a new day
    ok(await sponsor(api, policy, op))
    ok(await sponsor(api, policy, op))
    refused_again = await sponsor(api, policy, op)
    refused(refused_again, 429, policy, "max_per_user_per_day")
    assert refused_again.headers["Retry-After"] == "86400"
    assert (await spend(api, policy))["reserved_operations"] == 5


async def test_rate_limit_is_per_policy_with_retry_after(api: Api) -> None:
    start = 1_900_000_123
    now = fake_clock(api, start)
    policy = await api.policy({"rate_limit": {"max_operations": 3, "interval_seconds": 3600}})
    senders = [await new_wallet(api) for _ in range(4)]
    for sender in senders[:3]:
        ok(await sponsor(api, policy, operation(sender, approve_call(api))))
    fourth = await sponsor(api, policy, operation(senders[3], approve_call(api)))
    message = refused(fourth, 429, policy, "rate_limit")
    assert fourth.headers["Retry-After"] == "3600"
    assert "3 operations sponsored in the last 3600 s" in message
    now[0] = start + 3599.5
    later = await sponsor(api, policy, operation(senders[3], approve_call(api)))
    refused(later, 429, policy, "rate_limit")
    assert later.headers["Retry-After"] == "1"
    now[0] = start + 3600  # the first three left the window
    ok(await sponsor(api, policy, operation(senders[3], approve_call(api))))


async def test_rate_limit_retry_after_is_never_too_early(api: Api) -> None:
    now = fake_clock(api, 1_900_000_123.9)
    policy = await api.policy({"rate_limit": {"max_operations": 1, "interval_seconds": 60}})
    op = operation(await new_wallet(api), approve_call(api))
    ok(await sponsor(api, policy, op))
    now[0] = 1_900_000_124.0
    refusal = await sponsor(api, policy, op)
    refused(refusal, 429, policy, "rate_limit")
    now[0] += int(refusal.headers["Retry-After"])
    ok(await sponsor(api, policy, op))  # waited as told


async def test_max_total_and_per_user_usd_budgets(api: Api) -> None:
    alice, bob, carol = [await new_wallet(api) for _ in range(3)]
    op = operation(alice, approve_call(api))
    cost = expected_usd(op, "0.7")

    total = await api.policy({"max_total_usd": usd(2 * cost)})
    for sender in (alice, bob):
        assert ok(await sponsor(api, total, operation(sender, approve_call(api))))[
            "sponsored_gas_usd"
        ] == usd(cost)
    message = refused(
        await sponsor(api, total, operation(carol, approve_call(api))), 403, total, "max_total_usd"
    )
    assert f"${usd(2 * cost)} of the policy's ${usd(2 * cost)} budget" in message
    # A cheaper operation still fits nothing: the budget is spent to the micro-dollar.
    tiny = operation(carol, b"", callGasLimit="0x0", verificationGasLimit="0x1")
    refused(await sponsor(api, total, tiny), 403, total, "max_total_usd")
    ledger = await spend(api, total)
    assert ledger["reserved_operations"] == 2 and ledger["reserved_usd"] == usd(2 * cost)

    per_user = await api.policy({"max_per_user_usd": usd(cost)})
    ok(await sponsor(api, per_user, op))
    refused(await sponsor(api, per_user, op), 403, per_user, "max_per_user_usd")
    ok(await sponsor(api, per_user, operation(bob, approve_call(api))))


async def test_daily_budget_renews_at_utc_midnight(api: Api) -> None:
    now = fake_clock(api, MIDNIGHT - 10)
    sender = await new_wallet(api)
    op = operation(sender, approve_call(api))
    cost = expected_usd(op, "0.7")
    policy = await api.policy({"max_total_usd": usd(cost), "budget_period": "day"})
    ok(await sponsor(api, policy, op))
    message = refused(await sponsor(api, policy, op), 403, policy, "max_total_usd")
    assert message.endswith(
        f"spent or reserved this day (UTC); this operation may cost ${usd(cost)}"
    )
    now[0] = MIDNIGHT
    ok(await sponsor(api, policy, op))


async def test_valid_from_and_valid_until_window(api: Api) -> None:
    start = MIDNIGHT + 3600
    iso = "2030-03-18T01:00:00Z"
    assert MIDNIGHT == 1_900_022_400 and start == 1_900_026_000  # iso names start
    policy = await api.policy({"valid_from": iso, "valid_until": start + 100})
    got = (await api.request("GET", f"/v1/gas/policies/{policy}")).json()
    assert got["rules"] == {"valid_from": start, "valid_until": start + 100}
    sender = await new_wallet(api)
    op = operation(sender, approve_call(api))
    now = fake_clock(api, start - 1)
    message = refused(await sponsor(api, policy, op), 403, policy, "valid_from")
    assert "not valid before 2030-03-18T01:00:00Z" in message
    now[0] = start
    ok(await sponsor(api, policy, op))
    now[0] = start + 99.9
    ok(await sponsor(api, policy, op))
    now[0] = start + 100
    message = refused(await sponsor(api, policy, op), 403, policy, "valid_until")
    assert "expired at 2030-03-18T01:01:40Z" in message


async def test_a_paused_policy_refuses_until_resumed(api: Api) -> None:
    policy = await api.policy({"max_per_user_per_day": 100})
    sender = await new_wallet(api)
    op = operation(sender, approve_call(api))
    ok(await sponsor(api, policy, op))
    paused = await api.request("PATCH", f"/v1/gas/policies/{policy}", {"status": "paused"})
    assert paused.status_code == 200 and paused.json()["status"] == "paused", paused.text
    assert paused.json()["rules"] == {"max_per_user_per_day": 100}
    message = refused(await sponsor(api, policy, op), 403, policy, "status")
    assert message.endswith("the policy is paused")
    assert (await evaluate(api, policy, op))["rule"] == "status"
    resumed = await api.request("PATCH", f"/v1/gas/policies/{policy}", {"status": "active"})
    assert resumed.json()["status"] == "active"
    ok(await sponsor(api, policy, op))
    assert (await spend(api, policy))["reserved_operations"] == 2


async def test_another_accounts_policy_is_not_found(api: Api) -> None:
    theirs = await api.policy({}, who="b")
    sender = await new_wallet(api)
    op = operation(sender, approve_call(api))
    not_found(await sponsor(api, theirs, op))
    not_found(await api.request("GET", f"/v1/gas/policies/{theirs}"))
    not_found(await api.request("PATCH", f"/v1/gas/policies/{theirs}", {"status": "paused"}))
    not_found(await api.request("PATCH", f"/v1/gas/policies/{theirs}", {"name": "mine"}))
    not_found(await api.request("DELETE", f"/v1/gas/policies/{theirs}"))
    not_found(
        await api.request("POST", f"/v1/gas/policies/{theirs}/evaluate", {"user_operation": op})
    )
    not_found(await sponsor(api, "gp_" + "0" * 24, op))
    # Untouched for its owner, who cannot use a's wallet record either.
    got = await api.request("GET", f"/v1/gas/policies/{theirs}", who="b")
    assert got.status_code == 200 and got.json()["status"] == "active"
    assert got.json()["name"] == "p"
    invalid(await sponsor(api, theirs, op, who="b"), "user_operation.sender")
    ok(await sponsor(api, theirs, operation(await new_wallet(api, who="b"), b""), who="b"))


# --- CRUD ------------------------------------------------------------------------------------


async def test_policy_crud(api: Api) -> None:
    token = api.manifest.address("erc20_cgt")
    rules = {
        "max_gas_usd": "0.50",
        "max_per_user_per_day": 5,
        "allowed_contracts": [token.lower(), "0x" + token[2:].upper(), token],
        "allowed_methods": ["approve(address, uint256)", "0x095EA7B3", APPROVE],
        "rate_limit": {"max_operations": 10, "interval_seconds": 60},
        "valid_from": "2030-01-01T00:00:00Z",
        "valid_until": 1_893_456_000 + 86_400,
        "max_total_usd": 100,
        "max_per_user_usd": "1.000000",
        "budget_period": "month",
    }
    normalised = {
        "max_gas_usd": "0.5",
        "max_per_user_per_day": 5,
        "allowed_contracts": [token],
        "allowed_methods": [APPROVE, "0x095ea7b3"],
        "rate_limit": {"max_operations": 10, "interval_seconds": 60},
        "valid_from": 1_893_456_000,
        "valid_until": 1_893_542_400,
        "max_total_usd": "100",
        "max_per_user_usd": "1",
        "budget_period": "month",
    }
    created = await api.request(
        "POST", "/v1/gas/policies", {"name": "  first ", "chain": "ethereum", "rules": rules}
    )
    assert created.status_code == 201, created.text
    first = created.json()
    assert set(first) == {"id", "name", "chain", "rules", "status", "created_at", "updated_at"}
    assert re.fullmatch(r"gp_[0-9A-Za-z]+", first["id"]), first
    assert first["name"] == "first" and first["chain"] == "ethereum"
    assert first["status"] == "active" and first["rules"] == normalised
    assert first["created_at"] == first["updated_at"]
    # budget_period "never" is the default and is not echoed.
    default = await api.request(
        "POST",
        "/v1/gas/policies",
        {"name": "second", "chain": "ethereum", "rules": {"budget_period": "never"}},
    )
    assert default.status_code == 201 and default.json()["rules"] == {}
    second = default.json()["id"]
    third = await api.policy({"max_per_user_per_day": 1})
    theirs = await api.policy({}, who="b")

    # List: oldest first, paged, only the caller's.
    page1 = (await api.request("GET", "/v1/gas/policies", limit="2")).json()
    assert [p["id"] for p in page1["policies"]] == [first["id"], second]
    assert (page1["page"], page1["total"], page1["limit"]) == (1, 3, 2)
    assert "spend" not in page1["policies"][0]
    page2 = (await api.request("GET", "/v1/gas/policies", limit="2", page="2")).json()
    assert [p["id"] for p in page2["policies"]] == [third] and page2["total"] == 3
    assert (await api.request("GET", "/v1/gas/policies", page="3", limit="2")).json()[
        "policies"
    ] == []
    every = (await api.request("GET", "/v1/gas/policies")).json()
    assert every["limit"] == 25 and theirs not in {p["id"] for p in every["policies"]}
    listed_b = (await api.request("GET", "/v1/gas/policies", who="b")).json()
    assert [p["id"] for p in listed_b["policies"]] == [theirs] and listed_b["total"] == 1
    invalid(await api.request("GET", "/v1/gas/policies", limit="0"), "limit")

    # Get: with its spend.
    got = (await api.request("GET", f"/v1/gas/policies/{first['id']}")).json()
    assert got == {**first, "spend": SPEND_ZERO}

    # Patch: name, rules (replaced whole), status.
    url = f"/v1/gas/policies/{first['id']}"
    renamed = await api.request("PATCH", url, {"name": "renamed"})
    assert renamed.status_code == 200, renamed.text
    assert renamed.json()["name"] == "renamed" and renamed.json()["rules"] == normalised
    replaced = (await api.request("PATCH", url, {"rules": {"max_per_user_per_day": 1}})).json()
    assert replaced["rules"] == {"max_per_user_per_day": 1} and replaced["name"] == "renamed"
    paused = (await api.request("PATCH", url, {"status": "paused"})).json()
    assert paused["status"] == "paused" and paused["rules"] == {"max_per_user_per_day": 1}
    invalid(await api.request("PATCH", url, {"status": "archived"}), "'status'")
    invalid(await api.request("PATCH", url, {"rules": {"bogus": 1}}), "rules.bogus")
    invalid(await api.request("PATCH", url, {"name": ""}), "'name'")
    invalid(await api.request("PATCH", url, {"chain": "ethereum"}), "'chain'")
    unchanged = (await api.request("PATCH", url, {})).json()
    assert {k: unchanged[k] for k in ("name", "status", "rules")} == {
        "name": "renamed",
        "status": "paused",
        "rules": {"max_per_user_per_day": 1},
    }
    assert unchanged["created_at"] == first["created_at"]

    # Delete: then gone.
    deleted = await api.request("DELETE", url)
    assert deleted.status_code == 200 and deleted.json() == {"id": first["id"], "deleted": True}
    not_found(await api.request("GET", url))
    not_found(await api.request("DELETE", url))
    not_found(await api.request("PATCH", url, {"name": "again"}))
    assert (await api.request("GET", "/v1/gas/policies")).json()["total"] == 2


async def test_a_deleted_policy_sponsors_nothing_and_forgets_its_ledger(api: Api) -> None:
    policy = await api.policy({})
    op = operation(await new_wallet(api), approve_call(api))
    ok(await sponsor(api, policy, op))
    assert (await api.request("DELETE", f"/v1/gas/policies/{policy}")).status_code == 200
    not_found(await sponsor(api, policy, op))


# --- bad input -------------------------------------------------------------------------------


def with_rules(**rules: Any) -> dict[str, Any]:
    return {"name": "p", "chain": "ethereum", "rules": rules}


BAD_ADDRESS = "0xFB6916095ca1df60bB79Ce92cE3Ea74c37c5d359"  # EIP-55 example, one case flipped
BAD_POLICIES: list[tuple[dict[str, Any], str]] = [
    (with_rules(max_gas_usd="1", gas_cap=1), "rules.gas_cap"),
    (with_rules(gas_cap=1, max_ops=2), "gas_cap, max_ops"),
    (with_rules(max_gas_usd="abc"), "rules.max_gas_usd"),
    (with_rules(max_gas_usd="0.1234567"), "rules.max_gas_usd"),
    (with_rules(max_gas_usd=0.5), "rules.max_gas_usd"),
    (with_rules(max_gas_usd="-1"), "rules.max_gas_usd"),
    (with_rules(max_gas_usd="1e3"), "rules.max_gas_usd"),
    (with_rules(max_gas_usd=True), "rules.max_gas_usd"),
    (with_rules(max_total_usd="10" * 8), "rules.max_total_usd"),
    (with_rules(allowed_contracts=["0x123"]), "rules.allowed_contracts[0]"),
    (with_rules(allowed_contracts=["0x" + "1" * 40, 7]), "rules.allowed_contracts[1]"),
    (with_rules(allowed_contracts=[BAD_ADDRESS]), "rules.allowed_contracts[0]"),
    (with_rules(allowed_contracts="0x" + "1" * 40), "rules.allowed_contracts"),
    (with_rules(allowed_methods=["transfer"]), "rules.allowed_methods[0]"),
    (with_rules(allowed_methods=["0x1234"]), "rules.allowed_methods[0]"),
    (with_rules(max_per_user_per_day=0), "rules.max_per_user_per_day"),
    (with_rules(max_per_user_per_day="5"), "rules.max_per_user_per_day"),
    (with_rules(max_per_user_per_day=True), "rules.max_per_user_per_day"),
    (with_rules(rate_limit={"max_operations": 10}), "rules.rate_limit.interval_seconds"),
    (
        with_rules(rate_limit={"max_operations": 0, "interval_seconds": 1}),
        "rules.rate_limit.max_operations",
    ),
    (
        with_rules(rate_limit={"max_operations": 1, "interval_seconds": 1, "burst": 2}),
        "rules.rate_limit.burst",
    ),
    (with_rules(rate_limit=10), "rules.rate_limit"),
    (with_rules(valid_from="yesterday"), "rules.valid_from"),
    (with_rules(valid_until=-5), "rules.valid_until"),
    (with_rules(valid_from=200, valid_until=100), "rules.valid_until"),
    (with_rules(budget_period="year"), "rules.budget_period"),
    ({"chain": "ethereum", "rules": {}}, "'name'"),
    ({"name": "", "chain": "ethereum", "rules": {}}, "'name'"),
    ({"name": 5, "chain": "ethereum", "rules": {}}, "'name'"),
    ({"name": "p", "chain": "ethereum"}, "'rules'"),
    ({"name": "p", "chain": "ethereum", "rules": []}, "'rules'"),
    ({"name": "p", "chain": "ethereum", "rules": {}, "owner": "me"}, "'owner'"),
]


async def test_bad_policies_are_400_naming_the_field(api: Api) -> None:
    for body, field in BAD_POLICIES:
        invalid(await api.request("POST", "/v1/gas/policies", body), field)
    assert (await api.request("GET", "/v1/gas/policies")).json()["total"] == 0


def bad_operations(api: Api, sender: str) -> list[tuple[dict[str, Any], dict[str, Any], str]]:
    """(operation, more body fields, what the 400 names)."""
    op = operation(sender, approve_call(api))
    factory = api.manifest.address("simple_account_factory_v07")
    no_call_data = {k: v for k, v in op.items() if k != "callData"}
    stranger = checksum_address(secrets.token_bytes(20))
    init_code = "0x" + factory[2:] + "00"
    u = "user_operation."
    return [
        (no_call_data, {}, u + "callData"),
        ({**op, "callData": "0x123"}, {}, u + "callData"),
        ({**op, "callGasLimit": "0xzz"}, {}, u + "callGasLimit"),
        ({**op, "callGasLimit": "lots"}, {}, u + "callGasLimit"),
        ({**op, "callGasLimit": hex(1 << 64)}, {}, u + "callGasLimit"),
        ({**op, "verificationGasLimit": -1}, {}, u + "verificationGasLimit"),
        ({**op, "nonce": hex(1 << 256)}, {}, u + "nonce"),
        ({**op, "maxPriorityFeePerGas": hex(4 * GWEI)}, {}, u + "maxPriorityFeePerGas"),
        ({**op, "maxFeePerGas": hex(1 << 128)}, {}, u + "maxFeePerGas"),
        ({**op, "initCode": init_code, "factory": factory}, {}, u + "initCode"),
        ({**op, "initCode": "0x1234"}, {}, u + "initCode"),
        ({**op, "factoryData": "0x1234"}, {}, u + "factoryData"),
        ({**op, "sender": "0x1234"}, {}, u + "sender"),
        ({**op, "bundler": "x"}, {}, u + "bundler"),
        (op, {"entry_point": api.manifest.address("erc20_cgt")}, "entry_point"),
        (op, {"entry_point": "0x12"}, "entry_point"),
        (operation(stranger, approve_call(api)), {}, u + "sender"),
    ]


async def test_bad_operations_are_400_naming_the_field(api: Api) -> None:
    policy = await api.policy({"max_gas_usd": "100"})
    sender = await new_wallet(api)
    for op, extra, field in bad_operations(api, sender):
        invalid(await sponsor(api, policy, op, **extra), field)
        evaluated = await api.request(
            "POST", f"/v1/gas/policies/{policy}/evaluate", {"user_operation": op, **extra}
        )
        invalid(evaluated, field)
    good = operation(sender, approve_call(api))
    invalid(await sponsor(api, "", good), "policy_id")
    invalid(await sponsor(api, "gp_" + "x" * 70, good), "policy_id")
    invalid(
        await api.request("POST", "/v1/gas/sponsor", {"chain": "ethereum", "policy_id": policy}),
        "user_operation",
    )
    assert (await spend(api, policy))["reserved_operations"] == 0
    ok(await sponsor(api, policy, good))


# --- evaluate --------------------------------------------------------------------------------


async def test_evaluate_answers_like_sponsor_and_names_the_refusing_rule(api: Api) -> None:
    now = fake_clock(api, MIDNIGHT - 3600)
    token = api.manifest.address("erc20_cgt")
    alice, bob = await new_wallet(api), await new_wallet(api)
    good = operation(alice, approve_call(api))
    cost = expected_usd(good, "0.7")
    rules = {
        "allowed_contracts": [token],
        "allowed_methods": [APPROVE],
        "max_gas_usd": usd(cost),
        "max_per_user_per_day": 1,
        "valid_from": MIDNIGHT - 7200,
        "valid_until": MIDNIGHT + 7200,
    }
    policy = await api.policy(rules)
    allowed = await evaluate(api, policy, good)
    assert allowed == {
        "allowed": True,
        "rule": None,
        "message": None,
        "sponsored_gas_usd": usd(cost),
        "entry_point_version": "0.7",
    }
    # A v0.6 wallet is evaluated as v0.6: its worst case triples verificationGasLimit.
    v06 = operation(await new_wallet(api, "0.6"), approve_call(api))
    unlimited = await evaluate(api, await api.policy({}), v06)
    assert unlimited["entry_point_version"] == "0.6"
    assert usd_micros(unlimited["sponsored_gas_usd"]) == expected_usd(v06, "0.6")

    other = api.manifest.address("erc721_collection")
    spender = api.manifest.accounts[1]
    cases = [
        (execute(other, abi.encode_call(APPROVE, spender, 1)), {}, "allowed_contracts"),
        (execute(token, abi.encode_call(TRANSFER, spender, 1)), {}, "allowed_methods"),
        (approve_call(api), {"callGasLimit": hex(300_000)}, "max_gas_usd"),
    ]
    for call_data, changes, rule in cases:
        op = operation(alice, call_data, **changes)
        refusal = await evaluate(api, policy, op)
        assert refusal["allowed"] is False and refusal["rule"] == rule, refusal
        sponsored = await sponsor(api, policy, op)
        assert refusal["message"] in refused(sponsored, 403, policy, rule)

    ok(await sponsor(api, policy, good))
    day = await evaluate(api, policy, good)
    assert (day["allowed"], day["rule"]) == (False, "max_per_user_per_day")
    assert day["sponsored_gas_usd"] == usd(cost)  # priced: it got as far as the counts
    assert (await evaluate(api, policy, operation(bob, approve_call(api))))["allowed"] is True

    now[0] = MIDNIGHT - 7201
    assert (await evaluate(api, policy, operation(bob, approve_call(api))))["rule"] == "valid_from"
    now[0] = MIDNIGHT + 7200
    assert (await evaluate(api, policy, operation(bob, approve_call(api))))["rule"] == "valid_until"
    now[0] = MIDNIGHT - 3600

    limited = await api.policy({"rate_limit": {"max_operations": 1, "interval_seconds": 60}})
    ok(await sponsor(api, limited, good))
    assert (await evaluate(api, limited, operation(bob, b"")))["rule"] == "rate_limit"
    budget = await api.policy({"max_total_usd": usd(cost)})
    ok(await sponsor(api, budget, good))
    assert (await evaluate(api, budget, operation(bob, approve_call(api))))[
        "rule"
    ] == "max_total_usd"
    await api.request("PATCH", f"/v1/gas/policies/{budget}", {"status": "paused"})
    paused = await evaluate(api, budget, good)
    assert (paused["allowed"], paused["rule"]) == (False, "status")
    assert paused["message"] == "the policy is paused"


async def test_evaluate_reserves_nothing(api: Api) -> None:
    policy = await api.policy({"max_per_user_per_day": 1})
    op = operation(await new_wallet(api), approve_call(api))
    for _ in range(3):
        assert (await evaluate(api, policy, op))["allowed"] is True
    assert await spend(api, policy) == SPEND_ZERO
    ok(await sponsor(api, policy, op))
    assert (await spend(api, policy))["reserved_operations"] == 1
    assert (await evaluate(api, policy, op))["rule"] == "max_per_user_per_day"


# --- concurrency -----------------------------------------------------------------------------


async def fire(api: Api, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """Every body POSTed to /v1/gas/sponsor at once."""
    answers: list[httpx.Response | None] = [None] * len(bodies)
    async with api.handle.client(
        headers={"X-API-Key": api.keys["a"]}, limits=httpx.Limits(max_connections=100)
    ) as client:

        async def one(i: int) -> None:
            answers[i] = await client.post("/v1/gas/sponsor", json=bodies[i])

        async with trio.open_nursery() as nursery:
            for i in range(len(bodies)):
                nursery.start_soon(one, i)
    assert all(a is not None for a in answers)
    return [a for a in answers if a is not None]


def tally(answers: list[httpx.Response], policy: str, status: int, rule: str) -> None:
    granted = [a for a in answers if a.status_code == 200]
    assert len(granted) == 10, sorted(a.status_code for a in answers)
    for answer in answers:
        if answer.status_code != 200:
            refused(answer, status, policy, rule)


async def test_fifty_concurrent_sponsorships_of_one_sender_rate_limited_to_ten(api: Api) -> None:
    policy = await api.policy({"rate_limit": {"max_operations": 10, "interval_seconds": 3600}})
    op = operation(await new_wallet(api), approve_call(api))
    body = {"chain": "ethereum", "policy_id": policy, "user_operation": op}
    answers = await fire(api, [body] * 50)
    tally(answers, policy, 429, "rate_limit")
    assert (await spend(api, policy))["reserved_operations"] == 10


async def test_fifty_concurrent_senders_against_a_budget_of_ten(api: Api) -> None:
    senders = [await new_wallet(api) for _ in range(50)]
    ops = [operation(s, approve_call(api)) for s in senders]
    cost = expected_usd(ops[0], "0.7")
    policy = await api.policy({"max_total_usd": usd(10 * cost)})
    answers = await fire(
        api, [{"chain": "ethereum", "policy_id": policy, "user_operation": op} for op in ops]
    )
    tally(answers, policy, 403, "max_total_usd")
    granted = {a.json()["userOpHash"] for a in answers if a.status_code == 200}
    assert len(granted) == 10
    ledger = await spend(api, policy)
    assert ledger["reserved_operations"] == 10 and ledger["reserved_usd"] == usd(10 * cost)
