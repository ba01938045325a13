"""WebSocket clients for the tests: the ``websockets`` library (an independent implementation)
driven from a worker thread, a raw socket client for misbehaving peers, and a contract that
emits the logs the tests ask for.

``websockets``' synchronous client runs its own reader thread; each test talks to it through
``trio.to_thread.run_sync`` so the trio loop running the gateway is never blocked.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from typing import Any

import trio
from websockets.sync.client import ClientConnection, connect

from chaingate.devnet.anvil import rpc_call

# A contract that emits LOG2(topic0 = calldata[0:32], topic1 = calldata[32:64]) with the rest
# of the calldata as the log's data (hand-assembled; see the bytes below).
LOGGER_RUNTIME = bytes.fromhex(
    "602035"  # PUSH1 32 CALLDATALOAD            -> topic1
    "600035"  # PUSH1 0 CALLDATALOAD             -> topic0
    "3660409003"  # CALLDATASIZE PUSH1 64 SWAP1 SUB -> size = calldatasize - 64
    "80"  # DUP1
    "6040600037"  # PUSH1 64 PUSH1 0 CALLDATACOPY  memory[0:size] = calldata[64:]
    "6000a200"  # PUSH1 0 LOG2 STOP
)
LOGGER_INIT = (
    bytes.fromhex(f"60{len(LOGGER_RUNTIME):02x}600c600039")  # CODECOPY(0, 12, size)
    + bytes.fromhex(f"60{len(LOGGER_RUNTIME):02x}6000f3")  # RETURN(0, size)
    + LOGGER_RUNTIME
)


def topic(n: int) -> str:
    return "0x" + n.to_bytes(32, "big").hex()


def deploy_logger(url: str) -> str:
    """Deploy the log emitter from anvil's first account; its address (lower case)."""
    sender = rpc_call(url, "eth_accounts")[0]  # type: ignore[index]
    tx = rpc_call(url, "eth_sendTransaction", [{"from": sender, "data": "0x" + LOGGER_INIT.hex()}])
    receipt = _receipt(url, str(tx))
    return str(receipt["contractAddress"]).lower()


def _receipt(url: str, tx: str) -> dict[str, Any]:
    for _ in range(200):
        receipt = rpc_call(url, "eth_getTransactionReceipt", [tx])
        if receipt:
            return receipt  # type: ignore[return-value]
        time.sleep(0.02)
    raise AssertionError(f"no receipt for {tx}")


def emit(url: str, contract: str, t0: int, t1: int, data: bytes = b"", mine: bool = True) -> str:
    """Send a transaction that makes ``contract`` emit one log; the transaction hash."""
    sender = rpc_call(url, "eth_accounts")[0]  # type: ignore[index]
    calldata = bytes.fromhex(topic(t0)[2:] + topic(t1)[2:]) + data
    tx = {"from": sender, "to": contract, "data": "0x" + calldata.hex(), "gas": hex(5_000_000)}
    tx_hash = str(rpc_call(url, "eth_sendTransaction", [tx]))
    if mine:
        _receipt(url, tx_hash)
    return tx_hash


class Client:
    """A ``websockets`` client connection used from trio (blocking calls in a thread)."""

    def __init__(self, manager: Any, conn: ClientConnection) -> None:
        self._manager = manager
        self.conn = conn
        self._next_id = 1
        self.early: list[Any] = []  # pushes received while waiting for an answer

    @classmethod
    async def open(cls, url: str, **kwargs: Any) -> Client:
        def enter() -> tuple[Any, ClientConnection]:
            # connect() itself may open the connection: never call it on the trio thread.
            manager = connect(url, open_timeout=10, **kwargs)
            return manager, manager.__enter__()

        manager, conn = await trio.to_thread.run_sync(enter)
        return cls(manager, conn)

    async def send(self, message: Any) -> None:
        text = message if isinstance(message, str | bytes) else json.dumps(message)
        await trio.to_thread.run_sync(self.conn.send, text)

    async def recv(self, seconds: float = 10.0) -> Any:
        """The next message (JSON); TimeoutError when none comes within ``seconds``."""
        raw = await trio.to_thread.run_sync(lambda: self.conn.recv(timeout=seconds))
        return json.loads(raw)

    async def call(self, method: str, params: list[Any] | None = None) -> Any:
        """One call; pushes that arrive before its answer are kept in ``self.early``."""
        call_id = self._next_id
        self._next_id += 1
        await self.send({"jsonrpc": "2.0", "id": call_id, "method": method, "params": params or []})
        while True:
            message = await self.recv()
            if message.get("id") == call_id:
                return message
            self.early.append(message)

    async def subscribe(self, *params: Any) -> str:
        reply = await self.call("eth_subscribe", list(params))
        assert "result" in reply, reply
        return str(reply["result"])

    async def subscribe_many(self, params: list[list[Any]]) -> list[str]:
        """Pipelined subscriptions: every request sent, then every acknowledgement read."""

        def run() -> list[str]:
            first = self._next_id
            self._next_id += len(params)
            for i, p in enumerate(params):
                call = {"jsonrpc": "2.0", "id": first + i, "method": "eth_subscribe", "params": p}
                self.conn.send(json.dumps(call))
            ids: dict[int, str] = {}
            while len(ids) < len(params):
                message = json.loads(self.conn.recv(timeout=10))
                if "id" in message:
                    ids[message["id"]] = message["result"]
                else:
                    self.early.append(message)
            return [ids[first + i] for i in range(len(params))]

        return await trio.to_thread.run_sync(run)

    async def close(self) -> None:
        await trio.to_thread.run_sync(self._manager.__exit__, None, None, None)

    @property
    def close_code(self) -> int | None:
        return self.conn.close_code

    async def closed(self, seconds: float = 10.0) -> int | None:
        """Wait until the server closes the connection; its close code."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                await trio.to_thread.run_sync(lambda: self.conn.recv(timeout=0.2))
            except TimeoutError:
                continue
            except Exception:  # ConnectionClosed: what we are waiting for
                return self.conn.close_code
        raise AssertionError("the server did not close the connection")


def handshake_bytes(path: str, key: bytes | None = None, extra: bytes = b"") -> bytes:
    key = key or base64.b64encode(os.urandom(16))
    return (
        b"GET " + path.encode() + b" HTTP/1.1\r\nHost: test\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + key + b"\r\n"
        + extra + b"\r\n"
    )  # fmt: skip


def client_frame(payload: bytes, opcode: int = 1, fin: bool = True) -> bytes:
    """A masked client frame."""
    mask = os.urandom(4)
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class RawClient:
    """A bare socket speaking just enough WebSocket to misbehave on purpose."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.buffer = b""

    @classmethod
    async def open(cls, port: int, path: str, *, rcvbuf: int | None = None) -> RawClient:
        sock = trio.socket.socket()
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        await sock.connect(("127.0.0.1", port))
        client = cls(sock)
        await sock.send(handshake_bytes(path))
        head = await client.read_until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        return client

    async def read_until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            data = await self.sock.recv(65536)
            if not data:
                raise EOFError
            self.buffer += data
        head, _, self.buffer = self.buffer.partition(marker)
        return head + marker

    async def send_json(self, message: Any) -> None:
        await self.sock.send(client_frame(json.dumps(message).encode()))

    async def frame(self) -> tuple[int, bytes]:
        """The next server frame: (opcode, payload); EOFError at end of stream."""
        while True:
            if len(self.buffer) >= 2:
                n = self.buffer[1] & 0x7F
                start = 2
                if n == 126:
                    n, start = int.from_bytes(self.buffer[2:4], "big"), 4
                elif n == 127:
                    n, start = int.from_bytes(self.buffer[2:10], "big"), 10
                if len(self.buffer) >= start + n:
                    opcode = self.buffer[0] & 0x0F
                    payload = self.buffer[start : start + n]
                    self.buffer = self.buffer[start + n :]
                    return opcode, payload
            data = await self.sock.recv(65536)
            if not data:
                raise EOFError
            self.buffer += data

    async def message(self) -> Any:
        """The next text message as JSON (control frames skipped)."""
        while True:
            opcode, payload = await self.frame()
            if opcode == 1:
                return json.loads(payload)

    def close(self) -> None:
        self.sock.close()
