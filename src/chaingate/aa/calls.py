"""What a SimpleAccount operation calls: its callData decoded into the inner calls, for policy.

Decodes exactly what the eth-infinitism SimpleAccount of each version accepts and does:
``execute(address,uint256,bytes)`` in all; ``executeBatch(address[],bytes[])`` (values 0) in
v0.6, ``executeBatch(address[],uint256[],bytes[])`` in v0.7, whose empty value array means all
zero, and v0.8's ``executeBatch((address,uint256,bytes)[])`` (BaseAccount's ``Call[]``, also
what a Simple7702Account takes). Decoding is as strict as Solidity's calldata decoder (offsets
and lengths inside the data, address words with clean upper bits, the contract's "wrong array
lengths" check), so a call the account would revert on is refused here rather than described.
Empty callData is no call at all (the EntryPoint skips the account call), so it decodes to no
inner calls.
"""

from __future__ import annotations

import msgspec

from chaingate.aa.userop import Version, require_version
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address

MAX_INNER_CALLS = 256

EXECUTE = abi.selector("execute(address,uint256,bytes)")
EXECUTE_BATCH_V06 = abi.selector("executeBatch(address[],bytes[])")
EXECUTE_BATCH_V07 = abi.selector("executeBatch(address[],uint256[],bytes[])")
EXECUTE_BATCH_V08 = abi.selector("executeBatch((address,uint256,bytes)[])")

_WORD = 32


class InnerCall(msgspec.Struct, frozen=True):
    target: str  # EIP-55
    value: int
    data: bytes

    @property
    def selector(self) -> bytes | None:
        """The called function's selector; None for a plain transfer (under 4 bytes of data)."""
        return self.data[:4] if len(self.data) >= 4 else None


class CallDataError(ValueError):
    """callData an API client sent is not a SimpleAccount call (the message says why)."""


class _Args:
    """Bounds-checked reads of ABI arguments (everything after the selector)."""

    def __init__(self, data: bytes, function: str) -> None:
        self.data = data
        self.function = function

    def fail(self, why: str) -> CallDataError:
        return CallDataError(f"callData is not a valid {self.function} call: {why}")

    def word(self, at: int) -> int:
        if at + _WORD > len(self.data):
            raise self.fail(f"truncated at byte {4 + at}")
        return int.from_bytes(self.data[at : at + _WORD], "big")

    def address(self, at: int) -> str:
        value = self.word(at)
        if value >> 160:
            raise self.fail(f"address word at byte {4 + at} has bits above 160")
        return checksum_address(value.to_bytes(20, "big"))

    def offset(self, base: int, head_at: int) -> int:
        """Where a dynamic value starts: ``base`` plus the offset word at ``head_at``."""
        target = base + self.word(head_at)
        if target + _WORD > len(self.data):  # also bounds a huge offset before any arithmetic
            raise self.fail(f"offset at byte {4 + head_at} points past the data")
        return target

    def bytes_at(self, at: int) -> bytes:
        length = self.word(at)
        if length > len(self.data) - at - _WORD:
            raise self.fail(f"bytes at byte {4 + at} run past the data")
        return self.data[at + _WORD : at + _WORD + length]

    def array(self, at: int, what: str) -> tuple[int, int]:
        """(count, start of the items) of a dynamic array whose length word is at ``at``."""
        count = self.word(at)
        if count > MAX_INNER_CALLS:
            raise CallDataError(
                f"{self.function}: {what} has {count} items; at most {MAX_INNER_CALLS} calls"
            )
        if count * _WORD > len(self.data) - at - _WORD:
            raise self.fail(f"{what} runs past the data")
        return count, at + _WORD


def _execute(args: _Args) -> list[InnerCall]:
    target = args.address(0)
    value = args.word(_WORD)
    data = args.bytes_at(args.offset(0, 2 * _WORD))
    return [InnerCall(target, value, data)]


def _execute_batch(args: _Args, with_values: bool) -> list[InnerCall]:
    dest_count, dest_at = args.array(args.offset(0, 0), "dest")
    if with_values:
        value_count, value_at = args.array(args.offset(0, _WORD), "value")
        func_head = 2 * _WORD
    else:
        value_count, value_at = 0, 0
        func_head = _WORD
    func_count, func_at = args.array(args.offset(0, func_head), "func")
    if dest_count != func_count or value_count not in (0, func_count):
        raise CallDataError(
            f"{args.function}: dest, value and func lengths differ ({dest_count}, "
            f"{value_count}, {func_count}); the account reverts 'wrong array lengths'"
        )
    calls = []
    for i in range(dest_count):
        target = args.address(dest_at + i * _WORD)
        value = args.word(value_at + i * _WORD) if value_count else 0
        # bytes[] item offsets are relative to the start of the items, after the length word.
        data = args.bytes_at(args.offset(func_at, func_at + i * _WORD))
        calls.append(InnerCall(target, value, data))
    return calls


def _execute_calls(args: _Args) -> list[InnerCall]:
    """v0.8's ``executeBatch(Call[])``: each item a (target, value, data) tuple, its offset
    relative to the start of the items, its data's offset relative to the item."""
    count, items_at = args.array(args.offset(0, 0), "calls")
    calls = []
    for i in range(count):
        item = args.offset(items_at, items_at + i * _WORD)
        target = args.address(item)
        value = args.word(item + _WORD)
        data = args.bytes_at(args.offset(item, item + 2 * _WORD))
        calls.append(InnerCall(target, value, data))
    return calls


def decode_account_calls(call_data: bytes, version: Version) -> list[InnerCall]:
    """The calls a SimpleAccount of ``version`` makes for ``call_data``; CallDataError when it
    is not an execute or executeBatch call the account would accept."""
    version = require_version(version)
    if not call_data:
        return []
    if len(call_data) < 4:
        raise CallDataError(f"callData of {len(call_data)} bytes is shorter than a selector")
    selector, args = call_data[:4], call_data[4:]
    if selector == EXECUTE:
        return _execute(_Args(args, "execute(address,uint256,bytes)"))
    if version == "0.6" and selector == EXECUTE_BATCH_V06:
        return _execute_batch(_Args(args, "executeBatch(address[],bytes[])"), with_values=False)
    if version == "0.7" and selector == EXECUTE_BATCH_V07:
        return _execute_batch(
            _Args(args, "executeBatch(address[],uint256[],bytes[])"), with_values=True
        )
    if version == "0.8" and selector == EXECUTE_BATCH_V08:
        return _execute_calls(_Args(args, "executeBatch((address,uint256,bytes)[])"))
    raise CallDataError(
        f"callData is not a SimpleAccount v{version} execute or executeBatch call "
        f"(selector 0x{selector.hex()})"
    )
