"""Many read calls in one round trip: Multicall3 ``aggregate3`` inside one JSON-RPC batch.

Calls are grouped **per target contract**: each target's calls travel as one ``aggregate3``
``eth_call`` (``allowFailure`` on every call), and all those ``eth_call``s go out as one
JSON-RPC batch.  A contract that burns all the gas it is given, or reverts oddly, can then only
fail its own calls, never another token's.  When an ``aggregate3`` call itself fails (no
Multicall3 at that address, the node refuses it) its calls are retried one ``eth_call`` each,
in one more batch.  Without a Multicall3 address every call is its own ``eth_call``, still
batched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address

AGGREGATE3 = "aggregate3((address,bool,bytes)[])"
# Deployed at this address on most EVM chains (a presigned transaction, same everywhere).
CANONICAL_MULTICALL3 = "0xcA11bde05977b3631167028862bE2a173976CA11"
# Calls per aggregate3: keeps one eth_call's gas and answer small.
MAX_CALLS_PER_AGGREGATE = 64


class Call(NamedTuple):
    target: str
    data: bytes


class Result(NamedTuple):
    ok: bool  # the call did not revert (a call to an address without code "succeeds")
    data: bytes  # return data, or revert data when not ok


def _hex(value: object) -> bytes:
    if not isinstance(value, str) or not value.startswith("0x"):
        raise ValueError("eth_call answer is not 0x-hex")
    return bytes.fromhex(value[2:])


def _revert_data(error: RpcCallError) -> bytes:
    try:
        return _hex(error.data)
    except ValueError:
        return b""


def _eth_call(to: str, data: bytes, block: str) -> tuple[str, list[Any]]:
    return ("eth_call", [{"to": to, "input": "0x" + data.hex()}, block])


class Multicall:
    """Batched reads over one network's ``ChainClient``."""

    def __init__(self, client: ChainClient, address: str | None) -> None:
        self.client = client
        self.address = checksum_address(address) if address else None

    async def run(self, calls: Sequence[Call], *, block: str = "latest") -> list[Result]:
        """One Result per call, in order; a call the EVM refused (a revert, no such
        function) is a failed Result.  Raises UpstreamError or RpcCallError when the node did
        not answer a call (unreachable, rate-limited, missing state): callers retry later."""
        if not calls:
            return []
        chunks: list[list[int]] = []
        by_target: dict[str, list[int]] = {}
        for i, call in enumerate(calls):
            by_target.setdefault(call.target.lower(), []).append(i)
        for indices in by_target.values():
            for start in range(0, len(indices), MAX_CALLS_PER_AGGREGATE):
                chunks.append(indices[start : start + MAX_CALLS_PER_AGGREGATE])
        results: list[Result | None] = [None] * len(calls)
        single: list[int] = []
        if self.address is None:
            single = list(range(len(calls)))
        else:
            requests = [self._aggregate([calls[i] for i in chunk], block) for chunk in chunks]
            answers = await self.client.batch(requests)
            for chunk, answer in zip(chunks, answers, strict=True):
                decoded = _decode_aggregate(answer, len(chunk))
                if decoded is None:
                    single.extend(chunk)
                    continue
                for i, result in zip(chunk, decoded, strict=True):
                    results[i] = result
        if single:
            answers = await self.client.batch(
                [_eth_call(calls[i].target, calls[i].data, block) for i in single]
            )
            for i, answer in zip(single, answers, strict=True):
                results[i] = _single_result(answer)
        return [r if r is not None else Result(False, b"") for r in results]

    def _aggregate(self, calls: Sequence[Call], block: str) -> tuple[str, list[Any]]:
        assert self.address is not None
        data = abi.encode_call(AGGREGATE3, [(c.target, True, c.data) for c in calls])
        return _eth_call(self.address, data, block)


def _decode_aggregate(answer: object, count: int) -> list[Result] | None:
    """aggregate3's Result[] — None when the answer is an error or not that shape."""
    if isinstance(answer, RpcCallError):
        return None
    try:
        (items,) = abi.decode(["(bool,bytes)[]"], _hex(answer))
    except ValueError:  # AbiError is a ValueError
        return None
    if len(items) != count:
        return None
    return [Result(bool(ok), bytes(data)) for ok, data in items]


# What a node says when the call itself failed in the EVM — an answer about the contract — as
# opposed to a node that could not answer (rate limit, missing state, timeout).
# (geth: "execution reverted", "out of gas", "invalid opcode: ..."; anvil: "EVM error OutOfGas")
_EXECUTION_FAILURES = ("revert", "evm error", "out of gas", "outofgas", "opcode", "stack", "jump")


def is_execution_failure(error: RpcCallError) -> bool:
    message = error.message.lower()
    return error.code == 3 or any(words in message for words in _EXECUTION_FAILURES)


def _single_result(answer: object) -> Result:
    if isinstance(answer, RpcCallError):
        if not is_execution_failure(answer):
            # Not an answer about the contract: a "no" now would be remembered as a fact
            # (a token taken for none); the caller retries later instead.
            raise answer
        return Result(False, _revert_data(answer))
    try:
        return Result(True, _hex(answer))
    except ValueError:
        return Result(False, b"")


async def detect_multicall(client: ChainClient, candidates: Sequence[str]) -> str | None:
    """The first candidate address that holds code, or None (plain eth_calls then)."""
    for address in candidates:
        if not address:
            continue
        code = await client.call("eth_getCode", [address, "latest"])
        if isinstance(code, str) and len(code) > 2:
            return checksum_address(address)
    return None
