"""Gas policy rules without a chain: strict parsing (every refusal names its key) and each
rule's evaluation, the worst-case price, and the UTC calendar of budget periods."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chaingate.aa.calls import InnerCall
from chaingate.aa.userop import UserOperation
from chaingate.api.types import UnixTime
from chaingate.evm import abi
from chaingate.wallets.rules import (
    RateLimit,
    RuleError,
    Rules,
    Usage,
    check_operation,
    check_usage,
    parse_rules,
    period_start,
    usd_micros,
    usd_text,
)
from chaingate.wallets.sponsorship import usd_rate, wei_to_usd, worst_case_gas

TOKEN = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
OTHER = "0x000000000000000000000000000000000000dEaD"
TRANSFER = abi.selector("transfer(address,uint256)")


def parse(raw: Any) -> Rules:
    return parse_rules(raw, parse_time=UnixTime.parse)


def noon(day: str) -> int:
    return int(datetime.fromisoformat(f"{day}T12:00:00+00:00").timestamp())


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"max_gas_usd": "0.5", "color": "red"}, "rules.color"),
        ({"maxGasUsd": "1"}, "rules.maxGasUsd"),
        ({"max_gas_usd": 0.5}, "rules.max_gas_usd"),
        ({"max_gas_usd": "-1"}, "rules.max_gas_usd"),
        ({"max_gas_usd": "1.1234567"}, "rules.max_gas_usd"),
        ({"max_gas_usd": "1e3"}, "rules.max_gas_usd"),
        ({"max_per_user_per_day": 0}, "rules.max_per_user_per_day"),
        ({"max_per_user_per_day": True}, "rules.max_per_user_per_day"),
        ({"max_per_user_per_day": "5"}, "rules.max_per_user_per_day"),
        ({"allowed_contracts": TOKEN}, "rules.allowed_contracts"),
        ({"allowed_contracts": [TOKEN, "0x12"]}, "rules.allowed_contracts[1]"),
        ({"allowed_contracts": [TOKEN.replace("F", "f", 1)]}, "rules.allowed_contracts[0]"),
        ({"allowed_contracts": [TOKEN] * 1001}, "rules.allowed_contracts"),
        ({"allowed_methods": ["transfer"]}, "rules.allowed_methods[0]"),
        ({"allowed_methods": ["0x1234"]}, "rules.allowed_methods[0]"),
        ({"rate_limit": 10}, "rules.rate_limit"),
        ({"rate_limit": {"max_operations": 10}}, "rules.rate_limit.interval_seconds"),
        (
            {"rate_limit": {"max_operations": 1, "interval_seconds": 1, "x": 1}},
            "rules.rate_limit.x",
        ),
        ({"valid_from": "yesterday"}, "rules.valid_from"),
        ({"valid_from": "2026-01-02T00:00:00Z", "valid_until": "2026-01-01"}, "rules.valid_until"),
        ({"budget_period": "hour"}, "rules.budget_period"),
        ([], "rules"),
    ],
)
def test_a_bad_rule_is_refused_naming_its_key(raw: Any, named: str) -> None:
    with pytest.raises(RuleError) as caught:
        parse(raw)
    assert str(caught.value).startswith(named + ":") or str(caught.value).startswith(named)


def test_rules_are_normalised() -> None:
    rules = parse(
        {
            "max_gas_usd": "0.50",
            "allowed_contracts": [TOKEN.lower(), TOKEN],
            "allowed_methods": ["transfer(address, uint256)", "0xA9059CBB"],
            "rate_limit": {"max_operations": 5, "interval_seconds": 60},
            "valid_from": 1_700_000_000,
            "budget_period": "month",
        }
    )
    assert rules.max_gas_usd == "0.5"
    assert rules.allowed_contracts == [TOKEN]
    assert rules.allowed_methods == ["transfer(address,uint256)", "0xa9059cbb"]
    assert rules.selectors == frozenset({TRANSFER})
    assert rules.rate_limit == RateLimit(5, 60)
    assert rules.valid_from == 1_700_000_000


@given(st.integers(min_value=0, max_value=10**18))
def test_usd_text_round_trips(micros: int) -> None:
    assert usd_micros(usd_text(micros)) == micros


def test_each_operation_rule_refuses_what_it_should() -> None:
    rules = parse(
        {
            "allowed_contracts": [TOKEN],
            "allowed_methods": ["transfer(address,uint256)"],
            "max_gas_usd": "2",
            "valid_from": "2026-01-01T00:00:00Z",
            "valid_until": "2026-02-01T00:00:00Z",
        }
    )
    now = noon("2026-01-15")
    good = InnerCall(TOKEN, 0, TRANSFER + bytes(64))
    assert check_operation(rules, [good], 2_000_000, now) is None
    cases = [
        ([good, InnerCall(OTHER, 0, TRANSFER)], 1, now, "allowed_contracts", "call 2 of 2"),
        ([good, InnerCall(TOKEN, 0, b"\x09\x5e\xa7\xb3")], 1, now, "allowed_methods", "call 2"),
        ([InnerCall(TOKEN, 5, b"")], 1, now, "allowed_methods", "plain transfer"),
        ([good], 2_000_001, now, "max_gas_usd", "$2.000001"),
        ([good], 1, noon("2025-12-31"), "valid_from", "2026-01-01T00:00:00Z"),
        ([good], 1, noon("2026-02-01"), "valid_until", "2026-02-01T00:00:00Z"),
    ]
    for calls, cost, at, rule, text in cases:
        refusal = check_operation(rules, calls, cost, at)
        assert refusal is not None and refusal.rule == rule, (rule, refusal)
        assert text in refusal.message


def test_an_allowlist_covers_the_accounts_factory() -> None:
    listed = parse({"allowed_contracts": [TOKEN]})
    good = [InnerCall(TOKEN, 0, TRANSFER)]
    ours = "0x" + "fa" * 20
    refusal = check_operation(listed, good, 1, 0, factory=OTHER, known_factories=[ours])
    assert refusal is not None and refusal.rule == "allowed_contracts", refusal
    assert OTHER in refusal.message
    for factory in (ours.upper().replace("0X", "0x"), TOKEN.lower(), None):
        assert check_operation(listed, good, 1, 0, factory=factory, known_factories=[ours]) is None
    unlisted = parse({"allowed_methods": ["transfer(address,uint256)"]})
    assert check_operation(unlisted, good, 1, 0, factory=OTHER, known_factories=[ours]) is None


def test_usage_rules_refuse_at_their_limits_and_say_when_to_retry() -> None:
    rules = parse(
        {
            "max_per_user_per_day": 3,
            "rate_limit": {"max_operations": 10, "interval_seconds": 60},
            "max_total_usd": "10",
            "max_per_user_usd": "4",
        }
    )
    now = noon("2026-03-10") + 3600  # 13:00 UTC
    fresh = Usage(0, 0, None, 0, 0)
    assert check_usage(rules, fresh, 4_000_000, now) is None
    day = check_usage(rules, Usage(3, 3, now - 5, 0, 0), 1, now)
    assert day is not None and day.rule == "max_per_user_per_day"
    assert day.retry_after == 11 * 3600  # until midnight UTC
    rate = check_usage(rules, Usage(0, 10, now - 50, 0, 0), 1, now)
    assert rate is not None and rate.rule == "rate_limit" and rate.retry_after == 10
    total = check_usage(rules, Usage(0, 0, None, 9_500_000, 0), 500_001, now)
    assert total is not None and total.rule == "max_total_usd" and total.retry_after is None
    assert check_usage(rules, Usage(0, 0, None, 9_500_000, 0), 500_000, now) is None
    sender = check_usage(rules, Usage(0, 0, None, 0, 3_000_000), 1_000_001, now)
    assert sender is not None and sender.rule == "max_per_user_usd"


def test_budget_periods_follow_the_utc_calendar() -> None:
    at = noon("2026-11-26")  # a Thursday
    assert period_start("never", at) == 0
    assert period_start("day", at) == noon("2026-11-26") - 12 * 3600
    assert period_start("week", at) == noon("2026-11-23") - 12 * 3600  # Monday
    assert period_start("month", at) == noon("2026-11-01") - 12 * 3600


def test_the_worst_case_is_what_the_entry_point_prefunds() -> None:
    op = UserOperation(
        sender=TOKEN,
        nonce=0,
        call_data=b"",
        call_gas_limit=100_000,
        verification_gas_limit=200_000,
        pre_verification_gas=50_000,
        max_fee_per_gas=10,
        max_priority_fee_per_gas=1,
        paymaster_verification_gas_limit=30_000,
        paymaster_post_op_gas_limit=7,
    )
    assert worst_case_gas(op, "0.7") == 380_007
    assert worst_case_gas(op, "0.6") == 100_000 + 3 * 200_000 + 50_000
    rate = usd_rate(Decimal("3000.123456789"))
    assert rate == 3_000_123_456
    assert wei_to_usd(10**18, rate) == rate
    assert wei_to_usd(1, rate) == 1  # rounded up: never under a limit by rounding
