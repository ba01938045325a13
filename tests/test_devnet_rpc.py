"""The devnet's own JSON-RPC client (``chaingate.devnet.rpc``) when the node dies mid-answer."""

from __future__ import annotations

import socket
import threading

import pytest

from chaingate.devnet.rpc import DevnetRpc


def test_a_reply_cut_short_is_a_connection_failure() -> None:
    # anvil killed while sending a large anvil_dumpState: http.client's IncompleteRead is no
    # OSError, and escaped every "node gone" handler (the save loop, the restart, the stop).
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]

    def answer_half() -> None:
        conn, _ = server.accept()
        with conn:
            # The whole request first: closing on unread bytes would reset the connection
            # (a different failure from the one under test).
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            head, _, body = request.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{"jsonrpc":')
            conn.shutdown(socket.SHUT_WR)  # a clean end, mid-answer

    thread = threading.Thread(target=answer_half, daemon=True)
    thread.start()
    try:
        with (
            DevnetRpc(f"http://127.0.0.1:{port}", timeout=5) as rpc,
            pytest.raises(ConnectionError, match="devnet node"),
        ):
            rpc.call("anvil_dumpState")
    finally:
        thread.join(5)
        server.close()
