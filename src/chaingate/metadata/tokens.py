"""What a contract is and says about itself, from raw call results (sans-IO).

``probe_calls(contract)`` lists the calls one contract needs (name, symbol, decimals,
totalSupply and the ERC-165 probes); ``interpret(results, hint)`` turns their results into
``TokenFacts``.  Decoding is forgiving where real tokens are odd and strict where a wrong
answer would mislead:

* ``name``/``symbol``: an ABI ``string``, or a ``bytes32`` (MKR and other early tokens),
  right-padded with zeros — decoded to text, never shown as hex.  Control characters are
  removed, length is bounded; undecodable bytes32 is no name at all.
* ``decimals``: absent (reverts, returns nothing) or out of ``uint8`` range → None.
* ERC-165 as EIP-165 prescribes: ``supportsInterface(0x01ffc9a7)`` true **and**
  ``supportsInterface(0xffffffff)`` false, then the ERC-721 / ERC-1155 interface ids.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from chaingate.evm import abi
from chaingate.metadata.model import Standard
from chaingate.metadata.multicall import Call, Result
from chaingate.printable import unprintable

NAME_MAX_CHARS = 256
SYMBOL_MAX_CHARS = 64
WORD = 32

ERC165_ID = bytes.fromhex("01ffc9a7")
INVALID_ID = bytes.fromhex("ffffffff")
ERC721_ID = bytes.fromhex("80ac58cd")
ERC1155_ID = bytes.fromhex("d9b67a26")

_SUPPORTS = "supportsInterface(bytes4)"
# Order of probe_calls' results.
_PROBES: tuple[tuple[str, bytes], ...] = (
    ("name", abi.encode_call("name()")),
    ("symbol", abi.encode_call("symbol()")),
    ("decimals", abi.encode_call("decimals()")),
    ("total_supply", abi.encode_call("totalSupply()")),
    ("erc165", abi.encode_call(_SUPPORTS, ERC165_ID)),
    ("invalid", abi.encode_call(_SUPPORTS, INVALID_ID)),
    ("erc721", abi.encode_call(_SUPPORTS, ERC721_ID)),
    ("erc1155", abi.encode_call(_SUPPORTS, ERC1155_ID)),
)
PROBE_COUNT = len(_PROBES)


class TokenFacts(msgspec.Struct, frozen=True):
    standard: Standard | None
    name: str | None
    symbol: str | None
    decimals: int | None
    total_supply: int | None


def probe_calls(contract: str) -> list[Call]:
    return [Call(contract, data) for _, data in _PROBES]


def clean_text(text: str, max_chars: int) -> str | None:
    """Printable text only (no control or format characters), trimmed and bounded."""
    kept = "".join(c for c in text if not unprintable(c))
    kept = kept.strip()[:max_chars].strip()
    return kept or None


def decode_text(data: bytes, max_chars: int) -> str | None:
    """An ABI ``string`` or a ``bytes32`` as text; None when it is neither."""
    if len(data) == WORD:
        raw = data.rstrip(b"\x00")
        if b"\x00" in raw:  # zeros inside: a hash or a number, not a padded name
            return None
        try:
            return clean_text(raw.decode("utf-8"), max_chars)
        except UnicodeDecodeError:
            return None
    if len(data) < 2 * WORD:
        return None
    try:
        (raw_bytes,) = abi.decode(["bytes"], data)
    except ValueError:
        return None
    return clean_text(bytes(raw_bytes).decode("utf-8", errors="replace"), max_chars)


def decode_uint(data: bytes, *, bits: int = 256) -> int | None:
    """The first word as an unsigned integer, None when absent or out of ``uint<bits>``."""
    if len(data) < WORD:
        return None
    value = int.from_bytes(data[:WORD], "big")
    return value if value < 1 << bits else None


def decode_bool(data: bytes) -> bool | None:
    """A strict ABI bool: 0 or 1 in the first word, None for anything else."""
    value = decode_uint(data)
    return None if value is None or value > 1 else value == 1


def _answer(result: Result) -> bytes:
    return result.data if result.ok else b""


def supports(results: dict[str, Result], interface: str) -> bool:
    """EIP-165's detection procedure over the probe results."""
    if decode_bool(_answer(results["erc165"])) is not True:
        return False
    if decode_bool(_answer(results["invalid"])) is not False:
        return False
    return decode_bool(_answer(results[interface])) is True


def interpret(results: Sequence[Result], hint: Standard | None = None) -> TokenFacts:
    """TokenFacts from ``probe_calls``' results (in order).

    The standard: ERC-165 first (it is the contract's own claim); else the indexer's hint
    from its logs when it names an NFT standard; else ERC-20 when ``totalSupply()`` answers;
    else None — not a token contract.
    """
    if len(results) != PROBE_COUNT:
        raise ValueError(f"expected {PROBE_COUNT} probe results, got {len(results)}")
    by_name = {name: result for (name, _), result in zip(_PROBES, results, strict=True)}
    is_721 = supports(by_name, "erc721")
    is_1155 = supports(by_name, "erc1155")
    total_supply = decode_uint(_answer(by_name["total_supply"]))
    standard: Standard | None
    if is_721 and is_1155:
        standard = hint if hint in ("ERC721", "ERC1155") else "ERC721"
    elif is_721:
        standard = "ERC721"
    elif is_1155:
        standard = "ERC1155"
    elif hint in ("ERC721", "ERC1155"):
        standard = hint
    elif total_supply is not None:
        standard = "ERC20"
    else:
        standard = None
    return TokenFacts(
        standard=standard,
        name=decode_text(_answer(by_name["name"]), NAME_MAX_CHARS),
        symbol=decode_text(_answer(by_name["symbol"]), SYMBOL_MAX_CHARS),
        decimals=decode_uint(_answer(by_name["decimals"]), bits=8),
        total_supply=total_supply,
    )


def balance_calls(owner: str, contracts: Sequence[str]) -> list[Call]:
    data = abi.encode_call("balanceOf(address)", owner)
    return [Call(contract, data) for contract in contracts]


def decode_balance(result: Result) -> int | None:
    """A ``balanceOf`` answer; None when the call reverted or answered nonsense."""
    return decode_uint(_answer(result))
