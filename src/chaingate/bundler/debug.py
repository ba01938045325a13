"""``debug_bundler_*``: the admin methods of the ERC-4337 bundler spec tests.

Registered only with ``[bundler] debug = true`` (``chaingate dev`` sets it): they clear the
mempool, bundle on demand and rewrite reputation, which no production client may do.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from chaingate.bundler.errors import INVALID_PARAMS, BundlerFault
from chaingate.bundler.network import BundlerNetwork
from chaingate.bundler.reputation import ReputationEntry
from chaingate.bundler.rpcform import address_param, encode_user_operation
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address

Handler = Callable[[Any, Any], Awaitable[Any]]


def _int(value: object, name: str) -> int:
    try:
        if isinstance(value, str):
            return int(value, 16) if value[:2] in ("0x", "0X") else int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    except ValueError:
        pass
    raise BundlerFault(INVALID_PARAMS, f"{name}: expected a number")


class DebugMethods:
    def __init__(self, net: BundlerNetwork) -> None:
        self.net = net

    def methods(self) -> dict[str, Handler]:
        return {
            "debug_bundler_clearState": self.clear_state,
            "debug_bundler_clearMempool": self.clear_mempool,
            "debug_bundler_dumpMempool": self.dump_mempool,
            "debug_bundler_setBundlingMode": self.set_mode,
            "debug_bundler_sendBundleNow": self.send_bundle_now,
            "debug_bundler_setReputation": self.set_reputation,
            "debug_bundler_dumpReputation": self.dump_reputation,
            "debug_bundler_clearReputation": self.clear_reputation,
            "debug_bundler_getStakeStatus": self.stake_status,
        }

    async def clear_state(self, params: object, principal: object) -> object:
        await self.net.clear(mempool=True, reputation=True)
        return "ok"

    async def clear_mempool(self, params: object, principal: object) -> object:
        await self.net.clear(mempool=True, reputation=False)
        return "ok"

    async def clear_reputation(self, params: object, principal: object) -> object:
        await self.net.clear(mempool=False, reputation=True)
        return "ok"

    async def dump_mempool(self, params: object, principal: object) -> object:
        wanted = None
        if isinstance(params, list) and params:
            wanted = self.net.version_of(params[0])
        return [
            encode_user_operation(e.op, e.version)
            for e in self.net.mempool.entries()
            if wanted is None or e.version == wanted
        ]

    async def set_mode(self, params: object, principal: object) -> object:
        if not isinstance(params, list) or len(params) != 1 or params[0] not in ("auto", "manual"):
            raise BundlerFault(INVALID_PARAMS, 'params: expected ["auto"] or ["manual"]')
        self.net.mode = params[0]
        return "ok"

    async def send_bundle_now(self, params: object, principal: object) -> object:
        """Returns once the bundle is mined; "ok" when no operation waits (as the reference
        bundler: never null, which clients read as "no result")."""
        sent = await self.net.bundle_once()
        return "ok" if sent is None else sent

    async def set_reputation(self, params: object, principal: object) -> object:
        if not isinstance(params, list) or not params or not isinstance(params[0], list):
            raise BundlerFault(
                INVALID_PARAMS, "params: expected [[{address, opsSeen, opsIncluded}], entryPoint?]"
            )
        entries = []
        for i, item in enumerate(params[0][:10_000]):
            if not isinstance(item, dict):
                raise BundlerFault(INVALID_PARAMS, f"params[0][{i}]: expected an object")
            entries.append(
                ReputationEntry(
                    address=address_param(item.get("address"), f"params[0][{i}].address").lower(),
                    ops_seen=_int(item.get("opsSeen", 0), f"params[0][{i}].opsSeen"),
                    ops_included=_int(item.get("opsIncluded", 0), f"params[0][{i}].opsIncluded"),
                )
            )
        try:
            self.net.reputation.set_reputation(entries)
        except ValueError as exc:
            raise BundlerFault(INVALID_PARAMS, str(exc)) from None
        await self.net.save_reputation()
        return "ok"

    async def dump_reputation(self, params: object, principal: object) -> object:
        return [
            {
                "address": checksum_address(entry.address),
                "opsSeen": hex(entry.ops_seen),
                "opsIncluded": hex(entry.ops_included),
                "status": status,
            }
            for entry, status in self.net.reputation.dump()
        ]

    async def stake_status(self, params: object, principal: object) -> object:
        if not isinstance(params, list) or len(params) != 2:
            raise BundlerFault(INVALID_PARAMS, "params: expected [address, entryPoint]")
        address = address_param(params[0], "address")
        version = self.net.version_of(params[1])
        entry_point = self.net.entry_points[version]
        data = abi.encode_call("getDepositInfo(address)", address)
        answer = await self.net.client.call(
            "eth_call", [{"to": entry_point, "data": "0x" + data.hex()}, "latest"]
        )
        _deposit, _staked, stake, delay, _withdraw = abi.decode(
            ["uint256", "bool", "uint256", "uint32", "uint48"], bytes.fromhex(answer[2:])
        )
        return {
            # Decimal strings, as the reference bundler answers (and the compliance suite reads).
            "stakeInfo": {"addr": address, "stake": str(stake), "unstakeDelaySec": str(delay)},
            "isStaked": self.net.reputation.is_staked(stake, delay),
        }
