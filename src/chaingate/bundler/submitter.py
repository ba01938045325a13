"""Bundle transactions: signed by the bundler's EOA, sent, watched until mined or replaced.

One bundle transaction is in flight per network at a time (the EOA's nonces are sequential;
a second bundle waits for the first), which keeps replacement simple: a transaction not
mined after ``resend_after`` — or dropped: neither mined nor pending in the node any more (a
reorg orphaned its block on a node that does not take orphaned transactions back into its
pool, or the pool evicted it) — is sent again with the same nonce, so only one copy can ever
be mined, and both fees raised by 12.5% (nodes want 10%), up to ``max_resends``; if an
earlier copy is mined meanwhile, that one counts.  Fees: the tip is the node's
``eth_maxPriorityFeePerGas`` (capped by what every operation in the bundle offers), the cap
twice the base fee plus the tip (likewise capped), so the bundle never pays more per gas
than its operations repay.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import trio

from chaingate.bundler.simulation import NodeClient
from chaingate.chain.client import RpcCallError
from chaingate.evm.eip7702 import Authorization
from chaingate.evm.keys import PrivateKey
from chaingate.evm.tx import Eip1559, Eip7702, tx_hash

log = logging.getLogger("chaingate.bundler")

BUMP_NUMERATOR, BUMP_DENOMINATOR = 1125, 1000  # +12.5% per resend
POLL_SECONDS = 0.25
# How long after a copy was sent the node must show it pending (several upstreams may lag)
# before its absence means it was dropped.
DROPPED_AFTER = 2.0
RECEIPT_RETRIES = 8


class Fees(msgspec.Struct, frozen=True):
    max_fee_per_gas: int
    max_priority_fee_per_gas: int

    def bumped(self) -> Fees:
        return Fees(
            -(-self.max_fee_per_gas * BUMP_NUMERATOR // BUMP_DENOMINATOR),
            -(-self.max_priority_fee_per_gas * BUMP_NUMERATOR // BUMP_DENOMINATOR),
        )


class Mined(msgspec.Struct, frozen=True):
    tx_hash: str
    block_number: int
    block_hash: str
    status: bool
    gas_used: int


class NotMined(Exception):
    """Every copy of the bundle was dropped or outpriced (the operations go back)."""


def bundle_fees(
    base_fee: int, suggested_tip: int, op_fees: Sequence[tuple[int, int]]
) -> Fees | None:
    """The bundle's fees from the node's suggestion, capped by the lowest the operations
    offer (``(maxFeePerGas, maxPriorityFeePerGas)`` each); None when one cannot pay the base
    fee (it must wait for a cheaper block)."""
    cap = min(fee for fee, _ in op_fees)
    tip_cap = min(tip for _, tip in op_fees)
    if cap < base_fee:
        return None
    tip = min(suggested_tip, tip_cap, cap - base_fee)
    return Fees(min(2 * base_fee + tip, cap), tip)


def _quantity(value: str | int) -> int:
    return int(value, 16) if isinstance(value, str) else int(value)


class Submitter:
    def __init__(
        self,
        client: NodeClient,
        key: PrivateKey,
        chain_id: int | None,
        *,
        resend_after: float,
        max_resends: int = 5,
    ) -> None:
        self.client = client
        self.key = key
        self.chain_id = chain_id
        self.resend_after = resend_after
        self.max_resends = max_resends
        self.lock = trio.Lock()  # one bundle in flight
        self.block_gas_limit: int | None = None  # the pending block's, read with the fees
        self.stats = {"sent": 0, "resent": 0, "mined": 0, "reverted": 0, "dropped": 0}

    @property
    def address(self) -> str:
        return self.key.address

    async def balance(self) -> int:
        return _quantity(await self.client.call("eth_getBalance", [self.address, "latest"]))

    async def current_fees(self) -> tuple[int, int]:
        """(the pending block's base fee, the node's suggested tip)."""
        block = await self.client.call("eth_getBlockByNumber", ["pending", False])
        base_fee = _quantity((block or {}).get("baseFeePerGas") or 0)
        self.block_gas_limit = _quantity((block or {}).get("gasLimit") or 0) or None
        try:
            tip = _quantity(await self.client.call("eth_maxPriorityFeePerGas", []))
        except RpcCallError:
            tip = 10**9  # a node without the method: 1 gwei, the common default
        return base_fee, tip

    async def next_nonce(self) -> int:
        return _quantity(
            await self.client.call("eth_getTransactionCount", [self.address, "pending"])
        )

    def sign(
        self,
        to: str,
        data: bytes,
        gas: int,
        fees: Fees,
        nonce: int,
        auths: tuple[Authorization, ...] = (),
    ) -> tuple[bytes, str]:
        """(raw transaction, its hash): known before it is sent, so it can be stored first.
        With ``auths`` (operations' EIP-7702 authorizations) a type-4 transaction."""
        if self.chain_id is None:
            raise RuntimeError("the chain id is not known yet")  # no bundle runs before it
        tx = Eip1559(
            chain_id=self.chain_id,
            nonce=nonce,
            max_priority_fee_per_gas=fees.max_priority_fee_per_gas,
            max_fee_per_gas=fees.max_fee_per_gas,
            gas=gas,
            to=to,
            data=data,
        )
        if auths:
            tx = Eip7702(**msgspec.structs.asdict(tx), authorizations=auths)
        raw = tx.sign(self.key)
        return raw, tx_hash(raw)

    async def send_raw(self, raw: bytes) -> None:
        try:
            await self.client.call("eth_sendRawTransaction", ["0x" + raw.hex()], retry_safe=False)
        except RpcCallError as exc:
            if "already known" not in exc.message.lower():
                raise
        self.stats["sent"] += 1

    async def receipt(self, hashes: Sequence[str]) -> Mined | None:
        for sent in hashes:
            receipt = await self.client.call("eth_getTransactionReceipt", [sent])
            if receipt:
                return Mined(
                    sent,
                    _quantity(receipt["blockNumber"]),
                    receipt["blockHash"],
                    _quantity(receipt.get("status", "0x1")) == 1,
                    _quantity(receipt.get("gasUsed", "0x0")),
                )
        return None

    async def wait_mined(
        self,
        first: str,
        nonce: int,
        to: str,
        data: bytes,
        gas: int,
        fees: Fees,
        auths: tuple[Authorization, ...] = (),
        *,
        before_resend: Callable[[str, bytes], Awaitable[None]] | None = None,
    ) -> Mined:
        """Until a copy is mined, resending with bumped fees when it stalls or the node
        dropped it; ``before_resend(hash, raw)`` is awaited before a copy is sent (to store
        it first, and its operations submitted under it: a reorg may have put them back)."""
        copies = [first]
        resends = 0
        sent_at = trio.current_time()
        while True:
            mined = await self.receipt(copies)
            if mined is not None:
                self.stats["mined" if mined.status else "reverted"] += 1
                return mined
            on_chain = _quantity(
                await self.client.call("eth_getTransactionCount", [self.address, "latest"])
            )
            if on_chain > nonce:
                # The nonce is used: ours (a node may count the nonce a moment before it
                # serves the receipt, so ask again a few times), or another transaction's.
                for _ in range(RECEIPT_RETRIES):
                    mined = await self.receipt(copies)
                    if mined is not None:
                        self.stats["mined" if mined.status else "reverted"] += 1
                        return mined
                    await trio.sleep(POLL_SECONDS)
                self.stats["dropped"] += 1
                raise NotMined(f"nonce {nonce} was used by another transaction")
            waited = trio.current_time() - sent_at
            stalled = waited >= self.resend_after
            dropped = not stalled and waited >= DROPPED_AFTER and await self.next_nonce() <= nonce
            if stalled or dropped:
                if resends >= self.max_resends:
                    self.stats["dropped"] += 1
                    raise NotMined(f"not mined after {resends} resends")
                fees = fees.bumped()
                raw, copy = self.sign(to, data, gas, fees, nonce, auths)
                if before_resend is not None:
                    await before_resend(copy, raw)
                await self.send_raw(raw)
                copies.append(copy)
                resends += 1
                self.stats["resent"] += 1
                sent_at = trio.current_time()
                log.info(
                    "bundle resent with higher fees",
                    extra={
                        "fields": {
                            "nonce": nonce,
                            "tx": copies[-1],
                            "resends": resends,
                            "dropped": dropped,
                        }
                    },
                )
            await trio.sleep(POLL_SECONDS)
