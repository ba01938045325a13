"""Gas policy rules: what a policy says (``Rules``, parsed strictly from a client's JSON) and
whether it lets one operation through (sans-IO: the caller brings the facts and the counts).

A refusal names its rule.  The checks split in two: ``check_operation`` needs only the
operation (targets, methods, worst-case cost, the clock) and runs before anything is locked;
``check_usage`` needs the policy's counts and runs inside the transaction that reserves the
spend, so concurrent requests at a limit see each other.

USD amounts are whole micro-dollars (``usd_micros``): exact sums, no floats.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import msgspec

from chaingate.aa.calls import InnerCall
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address

MAX_LIST = 1000  # entries of allowed_contracts / allowed_methods
MAX_USD = 10**12  # dollars: a bound on every USD amount a rule may hold
USD_DECIMALS = 6
_USD_SCALE = 1_000_000  # 10**USD_DECIMALS
_USD = re.compile(r"(0|[1-9][0-9]{0,12})(\.[0-9]{1,6})?")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_SELECTOR = re.compile(r"0x[0-9a-fA-F]{8}")
_SIGNATURE = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]{0,127}\((?:[a-z0-9\[\](),]{0,512})\)")

# Solidity's aliases: a selector is of the canonical names (uint256, int256).
_ALIAS = re.compile(r"(?<![a-z0-9])(u?int)(?![0-9a-z])")

BudgetPeriod = Literal["day", "week", "month", "never"]
RULE_KEYS = (
    "max_gas_usd",
    "max_per_user_per_day",
    "allowed_contracts",
    "allowed_methods",
    "rate_limit",
    "valid_from",
    "valid_until",
    "max_total_usd",
    "max_per_user_usd",
    "budget_period",
)


class RuleError(ValueError):
    """A rules object a client sent that cannot be a policy; the message names the key."""


class RateLimit(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """At most ``max_operations`` sponsorships in any ``interval_seconds``, whole policy."""

    max_operations: int
    interval_seconds: int


class Rules(msgspec.Struct, frozen=True, omit_defaults=True):
    max_gas_usd: str | None = None
    max_per_user_per_day: int | None = None
    allowed_contracts: list[str] | None = None  # EIP-55
    allowed_methods: list[str] | None = None  # as given: selectors or canonical signatures
    rate_limit: RateLimit | None = None
    valid_from: int | None = None  # Unix seconds
    valid_until: int | None = None
    max_total_usd: str | None = None
    max_per_user_usd: str | None = None
    budget_period: BudgetPeriod = "never"

    @property
    def selectors(self) -> frozenset[bytes] | None:
        if self.allowed_methods is None:
            return None
        return frozenset(method_selector(m) for m in self.allowed_methods)

    @property
    def contracts(self) -> frozenset[str] | None:
        if self.allowed_contracts is None:
            return None
        return frozenset(c.lower() for c in self.allowed_contracts)


def usd_micros(text: str) -> int:
    """``"1.25"`` -> 1_250_000."""
    whole, _, fraction = text.partition(".")
    return int(whole) * _USD_SCALE + int(fraction.ljust(USD_DECIMALS, "0") or 0)


def usd_text(micros: int) -> str:
    """1_250_000 -> "1.25"; 0 -> "0"."""
    whole, fraction = divmod(micros, _USD_SCALE)
    digits = f"{fraction:0{USD_DECIMALS}d}".rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)


def method_selector(method: str) -> bytes:
    if _SELECTOR.fullmatch(method):
        return bytes.fromhex(method[2:])
    return abi.selector(method)


# --- parsing ---------------------------------------------------------------------------------


def parse_rules(raw: object, *, parse_time: Callable[[object], int]) -> Rules:
    """Strict: unknown keys, wrong types and out-of-range values raise RuleError naming the
    key.  ``parse_time`` turns a client's timestamp text into Unix seconds (ValueError)."""
    if not isinstance(raw, Mapping):
        raise RuleError("rules: expected an object")
    unknown = sorted(str(k) for k in raw if k not in RULE_KEYS)
    if unknown:
        raise RuleError(
            f"rules.{unknown[0]}: unknown rule (known: {', '.join(RULE_KEYS)})"
            if len(unknown) == 1
            else f"rules: unknown rules {', '.join(unknown)} (known: {', '.join(RULE_KEYS)})"
        )
    found: dict[str, Any] = {}
    for key in ("max_gas_usd", "max_total_usd", "max_per_user_usd"):
        if raw.get(key) is not None:
            found[key] = _usd(key, raw[key])
    if raw.get("max_per_user_per_day") is not None:
        found["max_per_user_per_day"] = _count("max_per_user_per_day", raw["max_per_user_per_day"])
    if raw.get("allowed_contracts") is not None:
        found["allowed_contracts"] = _contracts(raw["allowed_contracts"])
    if raw.get("allowed_methods") is not None:
        found["allowed_methods"] = _methods(raw["allowed_methods"])
    if raw.get("rate_limit") is not None:
        found["rate_limit"] = _rate_limit(raw["rate_limit"])
    for key in ("valid_from", "valid_until"):
        if raw.get(key) is not None:
            value = raw[key]
            try:
                found[key] = int(parse_time(str(value) if isinstance(value, int) else value))
            except ValueError as exc:
                raise RuleError(f"rules.{key}: {exc}") from None
    if raw.get("budget_period") is not None:
        period = raw["budget_period"]
        if period not in ("day", "week", "month", "never"):
            raise RuleError("rules.budget_period: expected day, week, month or never")
        found["budget_period"] = period
    rules = Rules(**found)
    if (
        rules.valid_from is not None
        and rules.valid_until is not None
        and rules.valid_until <= rules.valid_from
    ):
        raise RuleError("rules.valid_until: must be later than valid_from")
    return rules


def _usd(key: str, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise RuleError(f'rules.{key}: expected a decimal string of US dollars, e.g. "0.50"')
    text = str(value)
    if not _USD.fullmatch(text) or usd_micros(text) > MAX_USD * _USD_SCALE:
        raise RuleError(
            f"rules.{key}: expected US dollars between 0 and {MAX_USD} with at most "
            f'{USD_DECIMALS} decimals, e.g. "0.50"'
        )
    return usd_text(usd_micros(text))


def _count(key: str, value: object, *, low: int = 1, high: int = 10**9) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RuleError(f"rules.{key}: expected an integer between {low} and {high}")
    return value


def _list(key: str, value: object) -> list[object]:
    if not isinstance(value, list):
        raise RuleError(f"rules.{key}: expected an array")
    if len(value) > MAX_LIST:
        raise RuleError(f"rules.{key}: at most {MAX_LIST} entries")
    return value


def _contracts(value: object) -> list[str]:
    found: list[str] = []
    for i, item in enumerate(_list("allowed_contracts", value)):
        if not isinstance(item, str) or not _ADDRESS.fullmatch(item):
            raise RuleError(f"rules.allowed_contracts[{i}]: expected an address")
        digits = item[2:]
        checksummed = checksum_address(item)
        if digits not in (digits.lower(), digits.upper()) and item != checksummed:
            raise RuleError(
                f"rules.allowed_contracts[{i}]: mixed-case address with a wrong EIP-55 checksum"
            )
        if checksummed not in found:
            found.append(checksummed)
    return found


def _methods(value: object) -> list[str]:
    found: list[str] = []
    for i, item in enumerate(_list("allowed_methods", value)):
        if not isinstance(item, str) or not (
            _SELECTOR.fullmatch(item) or _SIGNATURE.fullmatch(item.replace(" ", ""))
        ):
            raise RuleError(
                f"rules.allowed_methods[{i}]: expected a 4-byte selector (0x + 8 hex digits) "
                'or a canonical signature like "transfer(address,uint256)"'
            )
        method = item.lower() if _SELECTOR.fullmatch(item) else _canonical(i, item)
        if method not in found:
            found.append(method)
    return found


def _canonical(i: int, signature: str) -> str:
    """``approve(address, uint)`` -> ``approve(address,uint256)``: the text whose keccak is
    the selector.  A parameter list that is no ABI type is refused, never kept as a selector
    that matches nothing."""
    name, params = signature.replace(" ", "").split("(", 1)
    params = _ALIAS.sub(r"\g<1>256", "(" + params)
    try:
        abi.parse_type(params)
    except ValueError:
        raise RuleError(
            f"rules.allowed_methods[{i}]: {signature!r} has a parameter type that is no ABI type"
        ) from None
    return name + params


def _rate_limit(value: object) -> RateLimit:
    if not isinstance(value, Mapping):
        raise RuleError('rules.rate_limit: expected {"max_operations": N, "interval_seconds": S}')
    unknown = sorted(str(k) for k in value if k not in ("max_operations", "interval_seconds"))
    if unknown:
        raise RuleError(f"rules.rate_limit.{unknown[0]}: unknown key")
    for key in ("max_operations", "interval_seconds"):
        if key not in value:
            raise RuleError(f"rules.rate_limit.{key}: required")
    return RateLimit(
        _count("rate_limit.max_operations", value["max_operations"]),
        _count("rate_limit.interval_seconds", value["interval_seconds"], high=366 * 86400),
    )


# --- evaluation ------------------------------------------------------------------------------


class Refusal(msgspec.Struct, frozen=True):
    rule: str
    message: str
    # Seconds until the same request could pass (limits that free up with time), else None.
    retry_after: int | None = None


def check_operation(
    rules: Rules,
    calls: Sequence[InnerCall],
    cost_usd: int,
    now_s: int,
    *,
    factory: str | None = None,
    known_factories: Collection[str] = (),
) -> Refusal | None:
    """The rules that need only the operation: window, targets (the account's factory among
    them), methods, per-operation cost.  ``factory``: the one the operation deploys its
    account through; ``known_factories``: the operator's account factories on its network."""
    if rules.valid_from is not None and now_s < rules.valid_from:
        return Refusal("valid_from", f"the policy is not valid before {_iso(rules.valid_from)}")
    if rules.valid_until is not None and now_s >= rules.valid_until:
        return Refusal("valid_until", f"the policy expired at {_iso(rules.valid_until)}")
    contracts = rules.contracts
    selectors = rules.selectors
    if (
        contracts is not None
        and factory is not None
        and factory.lower() not in contracts
        and factory.lower() not in {known.lower() for known in known_factories}
    ):
        # The factory's code runs in validation, at the paymaster's expense: an allowlist
        # that bounds what an operation calls bounds what deploys its account too.
        return Refusal(
            "allowed_contracts",
            f"the operation deploys its account through {factory}, which is neither an "
            "account factory of this network nor allowed",
        )
    for i, call in enumerate(calls):
        where = f"call {i + 1} of {len(calls)}" if len(calls) > 1 else "the call"
        if contracts is not None and call.target.lower() not in contracts:
            return Refusal(
                "allowed_contracts", f"{where} targets {call.target}, which is not allowed"
            )
        if selectors is not None:
            selector = call.selector
            if selector is None:
                return Refusal(
                    "allowed_methods", f"{where} calls no method (a plain transfer of value)"
                )
            if selector not in selectors:
                return Refusal(
                    "allowed_methods", f"{where} calls method 0x{selector.hex()}, not allowed"
                )
    if rules.max_gas_usd is not None and cost_usd > usd_micros(rules.max_gas_usd):
        return Refusal(
            "max_gas_usd",
            f"the operation may cost up to ${usd_text(cost_usd)} in gas, over the policy's "
            f"${rules.max_gas_usd}",
        )
    return None


class Usage(msgspec.Struct, frozen=True):
    """The policy's counts that bear on one reservation, read inside its transaction."""

    sender_today: int  # the sender's live sponsorships this UTC day
    recent: int  # sponsorships signed within rate_limit.interval_seconds
    oldest_recent_s: int | None  # when the oldest of those was signed
    period_spent: int  # USD micros, whole policy, this budget period
    sender_period_spent: int


def check_usage(rules: Rules, usage: Usage, cost_usd: int, now_s: int) -> Refusal | None:
    if rules.max_per_user_per_day is not None and usage.sender_today >= rules.max_per_user_per_day:
        midnight = (now_s // 86400 + 1) * 86400
        return Refusal(
            "max_per_user_per_day",
            f"the sender has had {usage.sender_today} operations sponsored today (UTC), the "
            f"policy's limit",
            retry_after=max(1, midnight - now_s),
        )
    limit = rules.rate_limit
    if limit is not None and usage.recent >= limit.max_operations:
        oldest = usage.oldest_recent_s if usage.oldest_recent_s is not None else now_s
        return Refusal(
            "rate_limit",
            f"{usage.recent} operations sponsored in the last {limit.interval_seconds} s, the "
            f"policy's limit",
            retry_after=max(1, oldest + limit.interval_seconds - now_s),
        )
    if rules.max_total_usd is not None and usage.period_spent + cost_usd > usd_micros(
        rules.max_total_usd
    ):
        return Refusal(
            "max_total_usd",
            f"${usd_text(usage.period_spent)} of the policy's ${rules.max_total_usd} budget is "
            f"spent or reserved{_period(rules)}; this operation may cost ${usd_text(cost_usd)}",
        )
    if rules.max_per_user_usd is not None and usage.sender_period_spent + cost_usd > usd_micros(
        rules.max_per_user_usd
    ):
        return Refusal(
            "max_per_user_usd",
            f"${usd_text(usage.sender_period_spent)} of the sender's ${rules.max_per_user_usd} "
            f"is spent or reserved{_period(rules)}; this operation may cost "
            f"${usd_text(cost_usd)}",
        )
    return None


def period_start(period: BudgetPeriod, now_s: int) -> int:
    """Unix seconds where the current budget period began (UTC calendar)."""
    if period == "never":
        return 0
    day = datetime.fromtimestamp(now_s, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        day -= timedelta(days=day.weekday())  # Monday
    elif period == "month":
        day = day.replace(day=1)
    return int(day.timestamp())


def _period(rules: Rules) -> str:
    return "" if rules.budget_period == "never" else f" this {rules.budget_period} (UTC)"


def _iso(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
