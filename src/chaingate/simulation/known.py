"""The ABIs chaingate knows, by selector and topic: the token standards, the ERC-4337 contracts
(EntryPoint v0.6/v0.7/v0.8, SimpleAccount and its factory, the VerifyingPaymaster, the
SenderCreator), Multicall3, Chainlink-style price feeds and the devnet's own contracts.

A call is decoded by its selector, a log by its topic0 and indexed count (ERC-20 and ERC-721
``Transfer`` share a topic0), a revert by its error selector — whatever the address, since the
same interfaces sit at many.  Decoding is best effort and bounded: data over ``MAX_DECODE``
bytes, or that does not fit the signature, stays undecoded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chaingate.aa.userop import OP_TUPLE_TYPE
from chaingate.evm import abi
from chaingate.evm.reverts import Revert, decode_revert
from chaingate.evm.signatures import Signature, parse

__all__ = ["AUTHORITY", "MAX_DECODE", "decode_call", "decode_log", "event", "revert_of"]

# Who decoded it (Alchemy's field; its value there is the ABI source it used).
AUTHORITY = "CHAINGATE"
# Call data and log data longer than this are not decoded (an ABI decoder's output can be
# much larger than its input: arrays of offsets to one blob).
MAX_DECODE = 8192

_OP06, _OP07 = OP_TUPLE_TYPE["0.6"], OP_TUPLE_TYPE["0.7"]

_FUNCTIONS = (
    # ERC-20 (ERC-721's approve/transferFrom share these selectors)
    "transfer(address to, uint256 value) returns (bool)",
    "transferFrom(address from, address to, uint256 value) returns (bool)",
    "approve(address spender, uint256 value) returns (bool)",
    "balanceOf(address owner) returns (uint256)",
    "allowance(address owner, address spender) returns (uint256)",
    "totalSupply() returns (uint256)",
    "decimals() returns (uint8)",
    "symbol() returns (string)",
    "name() returns (string)",
    # ERC-721
    "safeTransferFrom(address from, address to, uint256 tokenId)",
    "safeTransferFrom(address from, address to, uint256 tokenId, bytes data)",
    "setApprovalForAll(address operator, bool approved)",
    "isApprovedForAll(address owner, address operator) returns (bool)",
    "ownerOf(uint256 tokenId) returns (address)",
    "getApproved(uint256 tokenId) returns (address)",
    "tokenURI(uint256 tokenId) returns (string)",
    "supportsInterface(bytes4 interfaceId) returns (bool)",
    "onERC721Received(address operator, address from, uint256 tokenId, bytes data) "
    "returns (bytes4)",
    # ERC-1155
    "safeTransferFrom(address from, address to, uint256 id, uint256 value, bytes data)",
    "safeBatchTransferFrom(address from, address to, uint256[] ids, uint256[] values, bytes data)",
    "balanceOf(address account, uint256 id) returns (uint256)",
    "balanceOfBatch(address[] accounts, uint256[] ids) returns (uint256[])",
    "uri(uint256 id) returns (string)",
    "onERC1155Received(address operator, address from, uint256 id, uint256 value, bytes data) "
    "returns (bytes4)",
    "onERC1155BatchReceived(address operator, address from, uint256[] ids, uint256[] values, "
    "bytes data) returns (bytes4)",
    # EntryPoint v0.6, v0.7 and v0.8 (v0.8's operation is v0.7's)
    f"handleOps({_OP06}[] ops, address beneficiary)",
    f"handleOps({_OP07}[] ops, address beneficiary)",
    f"simulateHandleOp({_OP06} op, address target, bytes targetCallData)",
    f"simulateHandleOp({_OP07} op, address target, bytes targetCallData) returns "
    "((uint256,uint256,uint256,uint256,bool,bytes))",
    f"getUserOpHash({_OP06} userOp) returns (bytes32)",
    f"getUserOpHash({_OP07} userOp) returns (bytes32)",
    "depositTo(address account)",
    "withdrawTo(address withdrawAddress, uint256 withdrawAmount)",
    "addStake(uint32 unstakeDelaySec)",
    "unlockStake()",
    "withdrawStake(address withdrawAddress)",
    "getNonce(address sender, uint192 key) returns (uint256 nonce)",
    "incrementNonce(uint192 key)",
    # SimpleAccount, its factory, the SenderCreator
    "execute(address dest, uint256 value, bytes func)",
    "executeBatch(address[] dest, bytes[] func)",
    "executeBatch(address[] dest, uint256[] value, bytes[] func)",
    "executeBatch((address,uint256,bytes)[] calls)",
    f"validateUserOp({_OP06} userOp, bytes32 userOpHash, uint256 missingAccountFunds) "
    "returns (uint256 validationData)",
    f"validateUserOp({_OP07} userOp, bytes32 userOpHash, uint256 missingAccountFunds) "
    "returns (uint256 validationData)",
    "createAccount(address owner, uint256 salt) returns (address)",
    "getAddress(address owner, uint256 salt) returns (address)",
    "createSender(bytes initCode) returns (address sender)",
    # VerifyingPaymaster
    f"validatePaymasterUserOp({_OP06} userOp, bytes32 userOpHash, uint256 maxCost) "
    "returns (bytes context, uint256 validationData)",
    f"validatePaymasterUserOp({_OP07} userOp, bytes32 userOpHash, uint256 maxCost) "
    "returns (bytes context, uint256 validationData)",
    "postOp(uint8 mode, bytes context, uint256 actualGasCost)",
    "postOp(uint8 mode, bytes context, uint256 actualGasCost, uint256 actualUserOpFeePerGas)",
    "deposit()",
    "getDeposit() returns (uint256)",
    # Multicall3
    "aggregate((address,bytes)[] calls) returns (uint256 blockNumber, bytes[] returnData)",
    "aggregate3((address,bool,bytes)[] calls) returns ((bool,bytes)[] returnData)",
    "aggregate3Value((address,bool,uint256,bytes)[] calls) returns ((bool,bytes)[] returnData)",
    "tryAggregate(bool requireSuccess, (address,bytes)[] calls) returns ((bool,bytes)[] "
    "returnData)",
    "getEthBalance(address addr) returns (uint256 balance)",
    # Price feeds
    "latestRoundData() returns (uint80 roundId, int256 answer, uint256 startedAt, "
    "uint256 updatedAt, uint80 answeredInRound)",
    "description() returns (string)",
    # The devnet's tokens
    "mint(address to, uint256 value)",
    "burn(uint256 value)",
    "airdrop(address[] to, uint256 amount)",
    "mint(address to, string uri) returns (uint256 tokenId)",
    "mint(address to, uint256 id, uint256 value, string uri)",
    "burn(address from, uint256 id, uint256 value)",
)

_EVENTS = (
    "Transfer(address indexed from, address indexed to, uint256 value)",
    "Transfer(address indexed from, address indexed to, uint256 indexed tokenId)",
    "Approval(address indexed owner, address indexed spender, uint256 value)",
    "Approval(address indexed owner, address indexed approved, uint256 indexed tokenId)",
    "ApprovalForAll(address indexed owner, address indexed operator, bool approved)",
    "TransferSingle(address indexed operator, address indexed from, address indexed to, "
    "uint256 id, uint256 value)",
    "TransferBatch(address indexed operator, address indexed from, address indexed to, "
    "uint256[] ids, uint256[] values)",
    "URI(string value, uint256 indexed id)",
    "MetadataUpdate(uint256 tokenId)",
    # EntryPoint
    "UserOperationEvent(bytes32 indexed userOpHash, address indexed sender, "
    "address indexed paymaster, uint256 nonce, bool success, uint256 actualGasCost, "
    "uint256 actualGasUsed)",
    "AccountDeployed(bytes32 indexed userOpHash, address indexed sender, address factory, "
    "address paymaster)",
    "UserOperationRevertReason(bytes32 indexed userOpHash, address indexed sender, "
    "uint256 nonce, bytes revertReason)",
    "PostOpRevertReason(bytes32 indexed userOpHash, address indexed sender, uint256 nonce, "
    "bytes revertReason)",
    "UserOperationPrefundTooLow(bytes32 indexed userOpHash, address indexed sender, uint256 nonce)",
    "BeforeExecution()",
    "Deposited(address indexed account, uint256 totalDeposit)",
    "Withdrawn(address indexed account, address withdrawAddress, uint256 amount)",
    "StakeLocked(address indexed account, uint256 totalStaked, uint256 unstakeDelaySec)",
    "StakeUnlocked(address indexed account, uint256 withdrawTime)",
    "StakeWithdrawn(address indexed account, address withdrawAddress, uint256 amount)",
    "SignatureAggregatorChanged(address indexed aggregator)",
    "SimpleAccountInitialized(address indexed entryPoint, address indexed owner)",
)

_ERRORS = (
    # EntryPoint
    "FailedOp(uint256 opIndex, string reason)",
    "FailedOpWithRevert(uint256 opIndex, string reason, bytes inner)",
    "SignatureValidationFailed(address aggregator)",
    "PostOpReverted(bytes returnData)",
    "SenderAddressResult(address sender)",
    # v0.8's accounts (BaseAccount): a batch's failed call, wrapped
    "ExecuteError(uint256 index, bytes error)",
    # The devnet's tokens
    "NotOwner()",
    "NotAuthorized()",
    "InvalidReceiver()",
    "InsufficientBalance()",
    "InsufficientAllowance()",
    "NonexistentToken(uint256 tokenId)",
    "WrongFrom()",
    "LengthMismatch()",
    # ERC-6093 (OpenZeppelin 5's token errors)
    "ERC20InsufficientBalance(address sender, uint256 balance, uint256 needed)",
    "ERC20InvalidSender(address sender)",
    "ERC20InvalidReceiver(address receiver)",
    "ERC20InsufficientAllowance(address spender, uint256 allowance, uint256 needed)",
    "ERC20InvalidApprover(address approver)",
    "ERC20InvalidSpender(address spender)",
    "ERC721InvalidOwner(address owner)",
    "ERC721NonexistentToken(uint256 tokenId)",
    "ERC721IncorrectOwner(address sender, uint256 tokenId, address owner)",
    "ERC721InvalidSender(address sender)",
    "ERC721InvalidReceiver(address receiver)",
    "ERC721InsufficientApproval(address operator, uint256 tokenId)",
    "ERC721InvalidApprover(address approver)",
    "ERC721InvalidOperator(address operator)",
    "ERC1155InsufficientBalance(address sender, uint256 balance, uint256 needed, uint256 tokenId)",
    "ERC1155InvalidSender(address sender)",
    "ERC1155InvalidReceiver(address receiver)",
    "ERC1155MissingApprovalForAll(address operator, address owner)",
    "ERC1155InvalidApprover(address approver)",
    "ERC1155InvalidOperator(address operator)",
    "ERC1155InvalidArrayLength(uint256 idsLength, uint256 valuesLength)",
    "OwnableUnauthorizedAccount(address account)",
)


def _by_selector(texts: Sequence[str]) -> dict[bytes, Signature]:
    table: dict[bytes, Signature] = {}
    for text in texts:
        signature = parse(text)
        table.setdefault(signature.selector, signature)  # the first listed wins a collision
    return table


FUNCTIONS: Mapping[bytes, Signature] = _by_selector(_FUNCTIONS)
ERRORS: Mapping[bytes, Signature] = _by_selector(_ERRORS)
EVENTS: Mapping[tuple[str, int], Signature] = {
    (s.topic, s.indexed_count): s for s in (parse(text) for text in _EVENTS)
}


def event(name: str) -> Signature:
    """A known event by name (the first listed of that name)."""
    return next(s for s in (parse(text) for text in _EVENTS) if s.name == name)


def decode_call(input_data: bytes, output: bytes | None) -> dict[str, Any] | None:
    """``{authority, methodName, inputs, outputs}`` of a call whose selector is known; the
    outputs only when ``output`` (a successful call's return data) is given and fits."""
    if len(input_data) < 4 or len(input_data) > MAX_DECODE:
        return None
    signature = FUNCTIONS.get(input_data[:4])
    if signature is None:
        return None
    try:
        inputs = signature.decode_args(input_data[4:])
    except (abi.AbiError, ValueError):
        return None
    decoded: dict[str, Any] = {
        "authority": AUTHORITY,
        "methodName": signature.name,
        "inputs": inputs,
    }
    if output is not None and signature.outputs and len(output) <= MAX_DECODE:
        try:
            decoded["outputs"] = signature.decode_outputs(output)
        except (abi.AbiError, ValueError):
            pass
    return decoded


def decode_log(topics: Sequence[str], data: bytes) -> dict[str, Any] | None:
    """``{authority, eventName, inputs}`` of a log whose event is known."""
    if not topics or len(data) > MAX_DECODE:
        return None
    signature = EVENTS.get((topics[0].lower(), len(topics) - 1))
    if signature is None:
        return None
    try:
        inputs = signature.decode_log(topics, data)
    except (abi.AbiError, ValueError):
        return None
    return {"authority": AUTHORITY, "eventName": signature.name, "inputs": inputs}


def revert_of(data: bytes) -> Revert:
    """Revert data decoded, the custom errors above known by name."""
    return decode_revert(data, ERRORS)
