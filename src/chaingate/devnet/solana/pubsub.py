"""Solana's PubSub over a ledger, with no I/O: subscriptions in, notifications out.

A ``Hub`` watches the ledger (``Ledger.observers``).  Each subscription has a commitment; when
a slot closes, every slot that has newly reached that commitment is looked at in order: its
transactions for ``signatureSubscribe`` and ``logsSubscribe``, and the account at that slot for
``accountSubscribe`` (sent when it differs from what was last sent).  ``slotSubscribe`` and
``rootSubscribe`` hear of every slot.  So a processed notification comes when its slot closes
(at most one slot late), not the instant the transaction runs.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from solders.pubkey import Pubkey

from chaingate.devnet.solana import codec
from chaingate.devnet.solana.accounts import ENCODINGS, account_filter
from chaingate.devnet.solana.ledger import COMMITMENTS, Block, Commitment, Ledger
from chaingate.devnet.solana.params import Code, invalid, pubkey
from chaingate.rpc.local import RpcFault

Send = Callable[[bytes], None]
_encode = msgspec.json.Encoder().encode
log = logging.getLogger("chaingate.devnet.solana")


@dataclass
class Subscription:
    id: int
    method: str  # the notification's method, e.g. "accountNotification"
    commitment: Commitment
    send: Send
    seen: int  # the last slot looked at
    key: Pubkey | None = None
    signature: str | None = None
    mentions: Pubkey | None = None
    encoding: str = "base64"
    filters: list[Callable[[bytes], bool]] = field(default_factory=list)
    last: object = field(default=None)


def _encoding(cfg: dict[str, Any]) -> str:
    encoding = cfg.get("encoding") or "binary"  # a validator's default here too
    if encoding not in ENCODINGS:
        raise invalid(f"Invalid params: unsupported encoding {encoding!r}")
    return str(encoding)


class Hub:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.subscriptions: dict[int, Subscription] = {}
        self._ids = itertools.count(1)
        ledger.observers.append(self.on_slot)

    def answer(self, text: bytes, send: Send, owned: set[int]) -> bytes:
        """The reply to one request of a client whose notifications go to ``send``."""
        try:
            request = msgspec.json.decode(text)
        except msgspec.DecodeError:
            return _encode(
                {"jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}, "id": None}
            )
        request_id = request.get("id") if isinstance(request, dict) else None
        try:
            if not isinstance(request, dict):
                raise RpcFault(Code.INVALID_REQUEST, "Invalid request")
            result = self._call(request.get("method"), request.get("params") or [], send, owned)
        except RpcFault as fault:
            return _encode({"jsonrpc": "2.0", "error": fault.error(), "id": request_id})
        except Exception as exc:  # a bug answers as one, and never takes the node down
            log.exception("solana node: pubsub request failed")
            internal = RpcFault(Code.INTERNAL_ERROR, f"Internal error: {exc!r}")
            return _encode({"jsonrpc": "2.0", "error": internal.error(), "id": request_id})
        return _encode({"jsonrpc": "2.0", "result": result, "id": request_id})

    def _call(self, method: object, params: object, send: Send, owned: set[int]) -> object:
        if not isinstance(params, list):
            raise invalid("Invalid params: expected an array")
        if isinstance(method, str) and method.endswith("Unsubscribe"):
            if not params or not isinstance(params[0], int) or params[0] not in owned:
                raise invalid("Invalid subscription id.")
            owned.discard(params[0])
            self.subscriptions.pop(params[0], None)
            return True
        subscription = self._subscription(method, params, send)
        self.subscriptions[subscription.id] = subscription
        owned.add(subscription.id)
        return subscription.id

    def _subscription(self, method: object, params: list[Any], send: Send) -> Subscription:
        cfg = params[-1] if params and isinstance(params[-1], dict) else {}
        commitment = cfg.get("commitment") or "finalized"
        if commitment not in COMMITMENTS:
            raise invalid(f"Invalid params: unknown commitment {commitment!r}")
        new = Subscription(
            id=next(self._ids),
            method="",
            commitment=commitment,
            send=send,
            seen=self._settled(commitment),
        )
        if method in ("slotSubscribe", "rootSubscribe"):
            new.method = method.replace("Subscribe", "Notification")
        elif method == "accountSubscribe" and params:
            new.method, new.key = "accountNotification", pubkey(params[0])
            new.encoding = _encoding(cfg)
            new.last = self._account(new, new.seen)
        elif method == "programSubscribe" and params:
            new.method, new.key = "programNotification", pubkey(params[0], "program id")
            new.encoding = _encoding(cfg)
            filters = cfg.get("filters") or []
            if not isinstance(filters, list) or len(filters) > 4:
                raise invalid("Too many filters provided; max 4")
            new.filters = [account_filter(spec) for spec in filters]
        elif method == "signatureSubscribe" and params and isinstance(params[0], str):
            new.method, new.signature = "signatureNotification", params[0]
        elif method == "logsSubscribe" and params:
            new.method = "logsNotification"
            wanted = params[0]
            if isinstance(wanted, dict):
                mentions = wanted.get("mentions")
                if not isinstance(mentions, list) or len(mentions) != 1:
                    raise invalid("Invalid Request: Only 1 address supported")
                new.mentions = pubkey(mentions[0])
            elif wanted not in ("all", "allWithVotes"):
                raise invalid("Invalid params: logs filter")
        else:
            raise RpcFault(Code.METHOD_NOT_FOUND, "Method not found")
        return new

    def _programs(self, sub: Subscription, slot: int) -> None:
        """programNotification for each account of the program that ``slot`` wrote."""
        block = self.ledger.blocks.get(slot)
        for key in sorted(block.undo if block else (), key=bytes):
            account = self.ledger.account(key, slot)
            if account is None or account.owner != sub.key:
                continue
            if all(test(bytes(account.data)) for test in sub.filters):
                value = {"account": codec.ui_account(account, sub.encoding), "pubkey": str(key)}
                self._notify(sub, {"context": {"slot": slot}, "value": value})

    def _settled(self, commitment: Commitment) -> int:
        """The last slot whose notifications at ``commitment`` can go out (a closed slot)."""
        return min(self.ledger.slot(commitment), self.ledger.head - 1)

    def _account(self, sub: Subscription, slot: int) -> object:
        assert sub.key is not None
        account = self.ledger.account(sub.key, slot)
        empty = {
            "data": codec.encode_data(b"", "base64"),
            "executable": False,
            "lamports": 0,
            "owner": str(codec.SYSTEM_PROGRAM),
            "rentEpoch": 0,
            "space": 0,
        }
        return empty if account is None else codec.ui_account(account, sub.encoding)

    def on_slot(self, block: Block) -> None:
        """The ledger opened ``block``: whatever has newly settled goes out."""
        for sub in list(self.subscriptions.values()):
            try:
                self._advance(sub, block)
            except Exception:  # one subscription's bug must not stop the slot clock
                log.exception("solana node: subscription %d dropped", sub.id)
                self.subscriptions.pop(sub.id, None)

    def _advance(self, sub: Subscription, block: Block) -> None:
        if sub.method == "slotNotification":
            root = self.ledger.slot("finalized")
            self._notify(sub, {"parent": block.parent_slot, "root": root, "slot": block.slot})
            return
        if sub.method == "rootNotification":
            root = self.ledger.slot("finalized")
            if root != sub.last:
                sub.last = root
                self._notify(sub, root)
            return
        settled = self._settled(sub.commitment)
        for slot in range(sub.seen + 1, settled + 1):
            if sub.id in self.subscriptions:
                self._slot_settled(sub, slot)
        sub.seen = max(sub.seen, settled)

    def _slot_settled(self, sub: Subscription, slot: int) -> None:
        context = {"slot": slot}
        if sub.method == "programNotification":
            self._programs(sub, slot)
            return
        if sub.method == "accountNotification":
            value = self._account(sub, slot)
            if value != sub.last:
                sub.last = value
                self._notify(sub, {"context": context, "value": value})
            return
        block = self.ledger.blocks.get(slot)
        for executed in block.transactions if block else []:
            if sub.method == "signatureNotification" and executed.signature == sub.signature:
                self._notify(sub, {"context": context, "value": {"err": executed.err}})
                del self.subscriptions[sub.id]  # a signature is notified once
                return
            if sub.method == "logsNotification" and (
                sub.mentions is None or sub.mentions in codec.account_keys(executed.tx)
            ):
                value = {
                    "err": executed.err,
                    "logs": executed.logs,
                    "signature": executed.signature,
                }
                self._notify(sub, {"context": context, "value": value})

    def _notify(self, sub: Subscription, result: object) -> None:
        params = {"result": result, "subscription": sub.id}
        sub.send(_encode({"jsonrpc": "2.0", "method": sub.method, "params": params}))

    def drop(self, owned: set[int]) -> None:
        """A client went away: its subscriptions with it."""
        for sub_id in owned:
            self.subscriptions.pop(sub_id, None)
