"""PeerClient against a scripted server socket: pooled connections and their end."""

from __future__ import annotations

import socket
import threading

from kvstack.kv.keys import ChunkKey
from kvstack.kv.tiers.peer import protocol
from kvstack.kv.tiers.peer.client import PeerClient

KEYS = [ChunkKey(bytes([i]) * 16) for i in range(3)]


def test_a_connection_in_use_at_close_is_closed_when_its_call_ends() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = PeerClient(f"127.0.0.1:{listener.getsockname()[1]}")
        answers: list[list[bool]] = []
        caller = threading.Thread(target=lambda: answers.append(client.lookup(KEYS)))
        caller.start()
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(5)
            conn.sendall(protocol.pack_hello(protocol.OK, protocol.AUTH_NONE, bytes(16)))
            request = conn.recv(protocol.REQUEST.size + 16 * len(KEYS), socket.MSG_WAITALL)
            assert protocol.parse_request(request[: protocol.REQUEST.size]).num_keys == 3
            client.close()  # while the lookup waits for its answer
            conn.sendall(protocol.pack_answer(protocol.OK, 3) + bytes([1, 0, 1]))
            caller.join(5)
            assert answers == [[True, False, True]]
            assert conn.recv(1) == b""  # the client closed it instead of keeping it idle
