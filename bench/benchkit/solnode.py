"""The devnet's Solana node (``chaingate.devnet.solana``: LiteSVM behind Solana's JSON-RPC) as a
process of its own, for the bench: ``python solnode.py --port N --ws-port M``.

A validator's pace (a slot every 400 ms, finalized 32 slots behind the head); stops on SIGTERM
or SIGINT.  Run by ``benchkit.solana.SolanaNode``.
"""

from __future__ import annotations

import argparse
import functools
import signal
import time

import trio

from chaingate.devnet.solana.ledger import Ledger
from chaingate.devnet.solana.server import SLOT_SECONDS, serve


async def main(port: int, ws_port: int, slot_seconds: float) -> None:
    ledger = Ledger(genesis_time=time.time())
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(
                functools.partial(
                    serve, ledger, port=port, ws_port=ws_port, slot_seconds=slot_seconds
                )
            )
            print(f"solana node on :{port} (ws :{ws_port})", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ws-port", type=int, required=True)
    parser.add_argument("--slot-seconds", type=float, default=SLOT_SECONDS)
    args = parser.parse_args()
    trio.run(main, args.port, args.ws_port, args.slot_seconds)
