"""Authenticated channels and credit-based flow control, on real sockets on 127.0.0.1; and the
coordinator refusing a connection that does not know the run's secret, and writing how many
records the run has read to its events."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable

import pytest

from nosync.driver.coordinator import Coordinator
from nosync.errors import AuthError
from nosync.modes import get_mode
from nosync.runtime import channels, frames

SECRET = b"the run's secret"
DEADLINE_S = 10.0


def wait_until(cond: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    """Polls `cond` until it holds; fails with `what` at the deadline."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


class Server:
    """Accepts one connection on a thread and runs `handler(sock)` on it; keeps the result or
    the exception."""

    def __init__(self, handler: Callable[[socket.socket], object]) -> None:
        self.listener = channels.listen("127.0.0.1", 0)
        self.address = self.listener.getsockname()
        self.result: object = None
        self.error: BaseException | None = None
        self._handler = handler
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sock, _ = self.listener.accept()
        try:
            self.result = self._handler(sock)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e
        finally:
            sock.close()

    def join(self) -> None:
        self._thread.join(DEADLINE_S)
        assert not self._thread.is_alive(), "server thread did not finish"
        self.listener.close()


# -- the handshake ---------------------------------------------------------------------------


def test_handshake_with_the_right_secret_delivers_the_identity():
    ident = {"role": "data", "from": 2, "to": 0, "note": "é"}
    server = Server(lambda s: channels.accept_handshake(s, SECRET))
    sock = channels.connect(server.address, SECRET, ident)
    try:
        server.join()
        assert server.error is None
        assert server.result == ident
        assert sock.gettimeout() is None  # blocking again after the handshake
    finally:
        sock.close()


def test_both_ends_of_a_handshake_send_small_frames_at_once():
    """Nagle's algorithm off on both sides (TCP_NODELAY): the coordinator's broadcasts and a
    worker's frames each go out when written, not after the acknowledgement of the one
    before."""

    def accept(s: socket.socket) -> int:
        channels.accept_handshake(s, SECRET)
        return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

    server = Server(accept)
    sock = channels.connect(server.address, SECRET, {"role": "worker"})
    try:
        server.join()
        assert server.error is None
        assert server.result != 0
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        sock.close()


def test_client_with_a_wrong_secret_is_refused_on_both_sides():
    server = Server(lambda s: channels.accept_handshake(s, SECRET))
    with pytest.raises(AuthError):
        channels.connect(server.address, b"not the secret", {"role": "worker"})
    server.join()
    assert isinstance(server.error, AuthError)
    assert "MAC mismatch" in str(server.error)


def impostor(secret: bytes) -> Callable[[socket.socket], object]:
    """A server that follows the protocol but proves `secret` instead of the run's."""

    def handler(sock: socket.socket) -> object:
        server_nonce = os.urandom(channels.NONCE)
        sock.sendall(channels.HELLO + server_nonce)
        f = sock.makefile("rb")
        (n,) = struct.unpack("<H", f.read(2))
        f.read(n)
        client_nonce = f.read(channels.NONCE)
        f.read(channels.MAC)
        sock.sendall(hmac.new(secret, b"s" + client_nonce + server_nonce, hashlib.sha256).digest())
        return sock.recv(1)  # b"": the client hung up on us

    return handler


def test_server_with_a_wrong_secret_is_detected_by_the_client():
    server = Server(impostor(b"a guess"))
    with pytest.raises(AuthError, match="server failed to prove"):
        channels.connect(server.address, SECRET, {"role": "worker"})
    server.join()
    assert server.error is None
    assert server.result == b""


def test_impostor_that_knows_the_secret_is_accepted():
    """Control for the test above: the same fake server with the right secret passes, so it is
    the secret, not the fake, that the client rejected."""
    server = Server(impostor(SECRET))
    sock = channels.connect(server.address, SECRET, {"role": "worker"})
    sock.close()
    server.join()
    assert server.error is None


def test_peer_that_is_not_a_nosync_endpoint():
    server = Server(lambda s: s.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"x" * 64))
    with pytest.raises(AuthError, match="not a nosync endpoint"):
        channels.connect(server.address, SECRET, {"role": "worker"})
    server.join()


def test_client_that_hangs_up_mid_handshake():
    server = Server(lambda s: channels.accept_handshake(s, SECRET))
    sock = socket.create_connection(server.address)
    assert len(sock.recv(len(channels.HELLO) + channels.NONCE, socket.MSG_WAITALL)) == 36
    sock.sendall(struct.pack("<H", 5) + b"ab")
    sock.close()
    server.join()
    assert isinstance(server.error, AuthError)
    assert "closed during the handshake" in str(server.error)


# -- credit flow -----------------------------------------------------------------------------


def connected_pair() -> tuple[socket.socket, socket.socket]:
    listener = channels.listen("127.0.0.1", 0)
    try:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    finally:
        listener.close()
    return a, b


def read_until(sock: socket.socket, reader: frames.FrameReader, sentinel: str) -> list[frames.Frame]:
    """Frames received up to and including the CONTROL frame whose body is `sentinel`."""
    sock.settimeout(DEADLINE_S)
    got: list[frames.Frame] = []
    while not got or got[-1].body != sentinel:
        data = sock.recv(1 << 16)
        assert data, "connection closed"
        got.extend(reader.feed(data))
    return got


def flush_all(conn: channels.Connection) -> None:
    wait_until(conn.flush, "the socket to take the queued frames")


def test_credits_bound_the_frames_queued_for_the_socket():
    a, b = connected_pair()
    conn = channels.Connection(a, "peer", credits=2)
    data = [frames.encode(frames.DATA, {"edge": 0, "epoch": 0}, [i]) for i in range(5)]
    try:
        for d in data:
            conn.send(d)
        assert conn.credits == 0
        assert conn.backlog == 5
        # a frame that needs no credit overtakes the waiting ones: it marks what reached the socket
        conn.send_uncounted(frames.encode(frames.CONTROL, {}, "mark-1"))
        flush_all(conn)
        assert conn.backlog == 3  # still waiting for credit
        reader = frames.FrameReader()
        got = read_until(b, reader, "mark-1")
        assert [f.body for f in got] == [(0,), (1,), "mark-1"]

        conn.grant(1)
        assert conn.credits == 0
        conn.send_uncounted(frames.encode(frames.CONTROL, {}, "mark-2"))
        flush_all(conn)
        assert [f.body for f in read_until(b, reader, "mark-2")] == [(2,), "mark-2"]
        assert conn.backlog == 2

        conn.grant(5)
        assert conn.credits == 3
        last = frames.encode(frames.DATA, {"edge": 0, "epoch": 1}, [5])
        conn.send(last)  # uses a credit at once
        assert conn.credits == 2
        conn.send_uncounted(frames.encode(frames.CONTROL, {}, "mark-3"))
        flush_all(conn)
        assert [f.body for f in read_until(b, reader, "mark-3")] == [(3,), (4,), (5,), "mark-3"]
        assert conn.backlog == 0
        marks = sum(len(frames.encode(frames.CONTROL, {}, m)) for m in ("mark-1", "mark-2", "mark-3"))
        assert conn.bytes_sent == sum(map(len, data)) + len(last) + marks
    finally:
        conn.close()
        b.close()


def test_frames_wait_behind_earlier_waiting_frames_even_with_credit():
    """FIFO: once a frame waits for credit, later frames queue behind it."""
    a, b = connected_pair()
    conn = channels.Connection(a, "peer", credits=1)
    try:
        conn.send(frames.encode(frames.DATA, {}, "first"))
        conn.send(frames.encode(frames.DATA, {}, "second"))
        conn.credits += 1  # a credit appears without grant() moving the queue
        conn.send(frames.encode(frames.DATA, {}, "third"))
        conn.grant(0)
        conn.send_uncounted(frames.encode(frames.CONTROL, {}, "mark"))
        flush_all(conn)
        got = [f.body for f in read_until(b, frames.FrameReader(), "mark")]
        assert got == ["first", "second", "mark"]
    finally:
        conn.close()
        b.close()


def test_receive_returns_frames_and_reports_the_peer_closing():
    a, b = connected_pair()
    receiver = channels.Connection(b, "sender")
    try:
        blobs = [frames.encode(frames.DATA, {"i": i}, list(range(i))) for i in range(4)]
        a.sendall(b"".join(blobs))
        got: list[frames.Frame] = []
        wait_until(lambda: got.extend(receiver.receive()) or len(got) == 4, "four frames")
        assert [f.header["i"] for f in got] == [0, 1, 2, 3]
        assert receiver.bytes_received == sum(map(len, blobs))
        a.close()

        def closed() -> bool:
            try:
                assert receiver.receive() == []
            except ConnectionError:
                return True
            return False

        wait_until(closed, "ConnectionError after the peer closed")
    finally:
        receiver.close()


# -- the coordinator refuses strangers -------------------------------------------------------


def worker_identity(run_id: str, worker: int = 0) -> dict:
    return {"role": "worker", "worker": worker, "attempt": 0, "run": run_id}


@pytest.fixture
def coordinator():
    c = Coordinator(1, SECRET, get_mode("none"), "run-1")
    yield c
    c.close()


def test_coordinator_refuses_a_wrong_secret_and_closes_the_connection(coordinator):
    sock = socket.create_connection(coordinator.address)
    try:
        with pytest.raises(AuthError):
            channels.connect_handshake(sock, b"wrong secret", worker_identity("run-1"))
        wait_until(lambda: coordinator.refused == 1, "coordinator.refused == 1")
        sock.settimeout(DEADLINE_S)
        try:
            assert sock.recv(1) == b""  # closed by the coordinator
        except ConnectionResetError:
            pass
    finally:
        sock.close()
    assert coordinator.conns == {}
    assert coordinator.refused == 1


def test_coordinator_refuses_the_right_secret_for_another_run(coordinator):
    # the MACs check out, so the handshake completes; then the identity is refused
    sock = channels.connect(coordinator.address, SECRET, worker_identity("run-2"))
    try:
        sock.settimeout(DEADLINE_S)
        assert sock.recv(1) == b""  # the coordinator hung up
    finally:
        sock.close()
    wait_until(lambda: coordinator.refused == 1, "coordinator.refused == 1")
    assert coordinator.conns == {}


def test_coordinator_registers_a_worker_with_the_right_secret(coordinator):
    with pytest.raises(AuthError):
        channels.connect(coordinator.address, b"wrong", worker_identity("run-1"))
    wait_until(lambda: coordinator.refused == 1, "the refusal")

    sock = channels.connect(coordinator.address, SECRET, worker_identity("run-1"))
    try:
        sock.sendall(
            frames.encode(
                frames.CONTROL,
                {},
                {"type": "register", "worker": 0, "attempt": 0, "addr": ["127.0.0.1", 4242]},
            )
        )
        sock.settimeout(DEADLINE_S)
        reader = frames.FrameReader()
        got: list[frames.Frame] = []
        while not got:
            data = sock.recv(1 << 16)
            assert data, "the coordinator closed a registered worker's connection"
            got.extend(reader.feed(data))
        assert got[0].kind == frames.CONTROL
        assert got[0].body == {"type": "peers", "gen": 0, "addresses": (("127.0.0.1", 4242),)}
        assert 0 in coordinator.conns
        assert coordinator.attempts == {0: 0}
        assert coordinator.refused == 1
        assert coordinator.failure is None
    finally:
        sock.close()


# -- the coordinator's progress events ---------------------------------------------------------


def test_coordinator_writes_the_records_read_as_progress_events_when_they_change(tmp_path):
    """The sum of the workers' last counts of records read goes to events.jsonl, at most every
    PROGRESS_EVENT_S and only when it changed; it may go down (a worker restored)."""
    from nosync.driver.coordinator import PROGRESS_EVENT_S

    c = Coordinator(2, SECRET, get_mode("none"), "run-1", run_dir=str(tmp_path))

    def reads() -> list[int]:
        return [e["read"] for e in c.events if e["event"] == "progress"]

    try:
        with c._lock:
            c.counters = {0: {"read": 5}, 1: {"read": 7}}
        wait_until(lambda: reads() == [12], "a progress event of 12 records")
        time.sleep(3 * PROGRESS_EVENT_S)
        assert reads() == [12], "a progress event without a change"
        with c._lock:
            c.counters = {0: {"read": 2}, 1: {"read": 7}}
        wait_until(lambda: reads() == [12, 9], "a progress event of 9 records")
        times = [e["t"] for e in c.events if e["event"] == "progress"]
        assert times[1] - times[0] >= PROGRESS_EVENT_S
    finally:
        c.close()
    with open(tmp_path / "events.jsonl", encoding="utf-8") as f:
        assert [e["read"] for e in map(json.loads, f) if e["event"] == "progress"] == [12, 9]
