"""SimpleAccount addresses: the counterfactual wallets a SimpleAccountFactory creates.

An account is an ERC1967Proxy in front of the factory's ``accountImplementation``, made with
``new ERC1967Proxy{salt: bytes32(salt)}(implementation, initialize(owner))``, so its address is
CREATE2(factory, salt, keccak(proxy creation code ++ abi.encode(implementation, call))).
Computing that locally, rather than one ``getAddress`` eth_call per wallet, needs the proxy's
creation code, which is compiled into the factory: ``learn_factory`` reads it out of the
factory's runtime code and proves it against the factory's own ``getAddress``.

Finding it: solc puts a sub-contract's creation code in the runtime's data section, beginning
with the free-memory-pointer prologue ``6080604052``.  It ends either where its own length
says — a constructor with arguments copies them from behind its code with ``PUSH2 <own
length> CODESIZE SUB`` among its first instructions — or right after a CBOR metadata trailer
(``a2 64 "ipfs" 58 22 <34 bytes> 64 "solc" 43 <version> 00 33``) that closes a compiled unit.
Each (start, end) pair of those is a candidate — a handful in a real factory, at most
``_MAX_MARKS``² — and only the one whose local address equals ``getAddress`` for a random owner
and salt is kept: a wrong guess can never be returned.  The only I/O in this package is here.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from chaingate.aa.paymaster import eth_signed_message_hash
from chaingate.aa.userop import Version, require_version
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address, create2_address, same_address

_PROLOGUE = bytes.fromhex("6080604052")
_TRAILER = re.compile(
    re.escape(bytes.fromhex("a264697066735822")) + b".{34}" + re.escape(b"dsolcC") + b"...\x00\x33",
    re.DOTALL,
)
_MAX_MARKS = 32  # prologues and ends considered: real factories have about three of each
_LENGTH_WINDOW = 64  # bytes after a prologue searched for the constructor's own length
_CODESIZE_SUB = b"\x38\x03"
_MAX_SALT = 1 << 256


def owner_digest(user_op_hash: bytes, version: Version) -> bytes:
    """What a SimpleAccount's owner (or an EIP-7702 account's own key) signs for an
    operation: v0.8's typed hash itself (eth_signTypedData_v4), before it the EIP-191
    message of the hash."""
    if require_version(version) == "0.8":
        return user_op_hash
    return eth_signed_message_hash(user_op_hash)


class RpcCaller(Protocol):
    """What ``learn_factory`` needs of a client (``ChainClient`` is one)."""

    async def call(self, method: str, params: Sequence[Any]) -> Any: ...


class FactoryMismatch(Exception):
    """The contract is not a SimpleAccountFactory whose addresses can be computed locally."""


class AccountFactory(msgspec.Struct, frozen=True):
    address: str  # the factory, EIP-55
    implementation: str  # factory.accountImplementation()
    proxy_creation_code: bytes  # type(ERC1967Proxy).creationCode, as embedded in the factory
    version: Version

    def account_address(self, owner: str, salt: int) -> str:
        """Where createAccount(owner, salt) puts the account (SimpleAccountFactory.getAddress)."""
        if not 0 <= salt < _MAX_SALT:
            raise ValueError(f"salt {salt} does not fit uint256")
        args = abi.encode(
            ["address", "bytes"],
            [self.implementation, abi.encode_call("initialize(address)", owner)],
        )
        return create2_address(
            self.address, salt.to_bytes(32, "big"), self.proxy_creation_code + args
        )

    def factory_data(self, owner: str, salt: int) -> bytes:
        """The factoryData (initCode after the factory address) that deploys that account."""
        return abi.encode_call("createAccount(address,uint256)", owner, salt)


def _own_length(runtime: bytes, start: int) -> int | None:
    """The length a constructor-with-arguments states for its own code, if one does here."""
    window_end = min(len(runtime), start + _LENGTH_WINDOW)
    for at in range(start, window_end):
        opcode = runtime[at]
        if opcode in (0x61, 0x62):  # PUSH2 / PUSH3
            size = opcode - 0x5F
            after = at + 1 + size
            if runtime[after : after + 2] == _CODESIZE_SUB:
                return int.from_bytes(runtime[at + 1 : after], "big")
    return None


def find_proxy_creation_code_candidates(runtime: bytes) -> list[bytes]:
    """Slices of a factory's runtime code that may be an embedded creation code, likeliest
    (a stated own length) first; see the module docstring."""
    starts = [m.start() for m in re.finditer(re.escape(_PROLOGUE), runtime)][:_MAX_MARKS]
    trailer_ends = [m.end() for m in _TRAILER.finditer(runtime)][:_MAX_MARKS]
    spans: list[tuple[int, int]] = []
    for start in starts:
        length = _own_length(runtime, start)
        if length is not None and start + length <= len(runtime):
            spans.append((start, start + length))
    spans += [(start, end) for start in starts for end in trailer_ends if end > start]
    seen: set[tuple[int, int]] = set()
    candidates = []
    for span in spans:
        if span not in seen:
            seen.add(span)
            candidates.append(runtime[span[0] : span[1]])
    return candidates


def _hex_bytes(value: object, what: str) -> bytes:
    if not isinstance(value, str) or value[:2] not in ("0x", "0X"):
        raise FactoryMismatch(f"{what}: expected 0x-hex from the node, got {value!r}")
    try:
        return bytes.fromhex(value[2:])
    except ValueError:
        raise FactoryMismatch(f"{what}: the node answered non-hex {value!r}") from None


async def _call_address(client: RpcCaller, to: str, calldata: bytes, what: str) -> str:
    reply = await client.call("eth_call", [{"to": to, "data": "0x" + calldata.hex()}, "latest"])
    data = _hex_bytes(reply, what)
    if len(data) != 32 or data[:12] != bytes(12):
        raise FactoryMismatch(f"{to}: {what} did not return an address (0x{data.hex()})")
    return checksum_address(data[12:])


async def learn_factory(
    client: RpcCaller,
    factory: str,
    version: Version,
    *,
    probe_owner: str | None = None,
    probe_salt: int | None = None,
) -> AccountFactory:
    """The factory at ``factory``, its proxy creation code proven against its ``getAddress``.

    A node error (a revert, the node unreachable) propagates as ``client`` raises it.
    """
    version = require_version(version)
    factory = checksum_address(factory)
    runtime = _hex_bytes(await client.call("eth_getCode", [factory, "latest"]), "eth_getCode")
    if not runtime:
        raise FactoryMismatch(f"no contract at {factory} (eth_getCode is empty)")
    implementation = await _call_address(
        client, factory, abi.encode_call("accountImplementation()"), "accountImplementation()"
    )
    owner = checksum_address(probe_owner or secrets.token_bytes(20))
    salt = secrets.randbits(256) if probe_salt is None else probe_salt
    expected = await _call_address(
        client,
        factory,
        abi.encode_call("getAddress(address,uint256)", owner, salt),
        "getAddress(address,uint256)",
    )
    candidates = find_proxy_creation_code_candidates(runtime)
    for code in candidates:
        learned = AccountFactory(factory, implementation, code, version)
        if same_address(learned.account_address(owner, salt), expected):
            return learned
    raise FactoryMismatch(
        f"{factory} is not a SimpleAccountFactory whose addresses chaingate can compute: none "
        f"of the {len(candidates)} embedded creation codes in its runtime code gives its "
        f"getAddress({owner}, {salt}) = {expected}"
    )
