"""TCP channels: authenticated connections carrying frames, with credit-based flow control.

Every connection, data or control, starts with a mutual HMAC-SHA256 handshake over nonces, keyed
by the run's secret, so nothing outside the run can inject records or control messages (and a
worker never talks to an impostor):

    server -> client   "NSY1" | server nonce (32)
    client -> server   identity length u16 | identity (msgpack map) | client nonce (32)
                       | HMAC(secret, "c" | server nonce | identity | client nonce)
    server -> client   HMAC(secret, "s" | client nonce | server nonce)

A connection that fails it is closed and logged. After the handshake a connection is
non-blocking and driven by the worker's event loop: `send` queues frames, `flush` writes what
the socket takes, `receive` returns the frames that arrived.

Flow control: a sender may have at most `credits` frames that the receiver has not yet
processed; the receiver returns credits (a CREDIT frame) as it processes, so a slow consumer
bounds the memory of its producers.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import queue
import socket
import struct
import threading
import time
from collections import deque

import msgpack

from nosync.errors import AuthError, FrameError
from nosync.runtime import frames

log = logging.getLogger("nosync.runtime.channels")

HELLO = b"NSY1"
NONCE = 32
MAC = 32
HANDSHAKE_TIMEOUT_S = 5.0
"""The whole handshake's deadline, on either side: a peer that sends a byte now and then cannot
stretch it (each `recv` waits only for what is left of it)."""
MAX_PENDING_HANDSHAKES = 16
"""Handshakes an `Acceptor` runs at once; a connection over the cap is closed at once, so that
strangers cannot take a worker's or the coordinator's threads or descriptors."""
INITIAL_CREDITS = 64


def _mac(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"".join(parts), hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AuthError(f"handshake not done within {HANDSHAKE_TIMEOUT_S:g} s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError:
            raise AuthError(f"handshake not done within {HANDSHAKE_TIMEOUT_S:g} s") from None
        if not chunk:
            raise AuthError("connection closed during the handshake")
        buf += chunk
    return bytes(buf)


def accept_handshake(sock: socket.socket, secret: bytes) -> dict:
    """Server side. Returns the client's identity; raises AuthError (the caller closes). The
    socket sends each frame at once (TCP_NODELAY), as `connect`'s does: with Nagle's algorithm
    a small frame waits for the acknowledgement of the one before, which a receiver that sends
    nothing back delays by up to 40 ms (Linux's delayed ACK)."""
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server_nonce = os.urandom(NONCE)
        sock.sendall(HELLO + server_nonce)
        (n,) = struct.unpack("<H", _recv_exact(sock, 2, deadline))
        ident_raw = _recv_exact(sock, n, deadline)
        client_nonce = _recv_exact(sock, NONCE, deadline)
        mac = _recv_exact(sock, MAC, deadline)
        if not hmac.compare_digest(mac, _mac(secret, b"c", server_nonce, ident_raw, client_nonce)):
            raise AuthError("handshake MAC mismatch: the peer does not know the run's secret")
        try:
            identity = msgpack.unpackb(ident_raw, raw=False)
        except Exception as e:
            raise AuthError(f"malformed identity in the handshake: {e}") from None
        if not isinstance(identity, dict):
            raise AuthError("malformed identity in the handshake")
        sock.sendall(_mac(secret, b"s", client_nonce, server_nonce))
        return identity
    except (OSError, struct.error) as e:
        raise AuthError(f"handshake failed: {e}") from None
    finally:
        sock.settimeout(None)


def connect_handshake(sock: socket.socket, secret: bytes, identity: dict) -> None:
    """Client side; raises AuthError if the server cannot prove the secret."""
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        hello = _recv_exact(sock, len(HELLO) + NONCE, deadline)
        if hello[: len(HELLO)] != HELLO:
            raise AuthError("the peer is not a nosync endpoint")
        server_nonce = hello[len(HELLO) :]
        ident_raw = msgpack.packb(identity, use_bin_type=True)
        client_nonce = os.urandom(NONCE)
        sock.sendall(
            struct.pack("<H", len(ident_raw))
            + ident_raw
            + client_nonce
            + _mac(secret, b"c", server_nonce, ident_raw, client_nonce)
        )
        reply = _recv_exact(sock, MAC, deadline)
        if not hmac.compare_digest(reply, _mac(secret, b"s", client_nonce, server_nonce)):
            raise AuthError("the server failed to prove the run's secret")
    except OSError as e:
        raise AuthError(f"handshake failed: {e}") from None
    finally:
        sock.settimeout(None)


def connect(address: tuple[str, int], secret: bytes, identity: dict, timeout: float = 10.0) -> socket.socket:
    """An authenticated, blocking connection to `address`."""
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        connect_handshake(sock, secret, identity)
    except BaseException:
        sock.close()
        raise
    return sock


class Connection:
    """A framed, non-blocking connection driven by an event loop."""

    def __init__(self, sock: socket.socket, peer: str, credits: int | None = None) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.peer = peer
        self.reader = frames.FrameReader()
        self._out: deque[memoryview] = deque()
        self.out_bytes = 0
        self.credits = credits  # None: not flow-controlled
        self._waiting: deque[bytes] = deque()
        self._resends = 0
        """Frames sent again (`send(resend=True)`) still waiting for credit: they lead the
        queue, and count in no backlog (they are old work, held in memory anyway)."""
        self.closed = False
        self.bytes_sent = 0
        self.bytes_received = 0

    def fileno(self) -> int:
        """The socket's file descriptor (for the worker's selector)."""
        return self.sock.fileno()

    def send(self, data: bytes, resend: bool = False) -> None:
        """Queues one frame; a flow-controlled connection holds it until it has a credit.
        REQUIRES: a frame sent again (`resend`) is queued before any new one."""
        if self.credits is None:
            self._out.append(memoryview(data))
            self.out_bytes += len(data)
        elif self.credits > 0 and not self._waiting:
            self.credits -= 1
            self._out.append(memoryview(data))
            self.out_bytes += len(data)
        else:
            self._waiting.append(data)
            if resend:
                self._resends += 1

    def send_uncounted(self, data: bytes) -> None:
        """Queues a frame that needs no credit (credits themselves)."""
        self._out.append(memoryview(data))
        self.out_bytes += len(data)

    def grant(self, n: int) -> None:
        """The receiver processed n more frames."""
        self.credits += n
        while self.credits > 0 and self._waiting:
            data = self._waiting.popleft()
            if self._resends:
                self._resends -= 1
            self.credits -= 1
            self._out.append(memoryview(data))
            self.out_bytes += len(data)

    @property
    def backlog(self) -> int:
        """Frames queued here: written-but-unsent plus waiting for credit, but for frames sent
        again to a peer that recovers."""
        return len(self._out) + len(self._waiting) - self._resends

    def flush(self) -> bool:
        """Writes what the socket takes now; True when nothing is left to write."""
        out = self._out
        try:
            while out:
                view = out[0]
                n = self.sock.send(view)
                self.bytes_sent += n
                self.out_bytes -= n
                if n < len(view):
                    out[0] = view[n:]
                    return False
                out.popleft()
        except (BlockingIOError, InterruptedError):
            return False
        return True

    def receive(self) -> list[frames.Frame]:
        """Frames that arrived; [] if none. Raises FrameError on a malformed frame and
        ConnectionError when the peer closed."""
        got = []
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                if got:
                    break
                raise ConnectionError(f"{self.peer} closed the connection")
            self.bytes_received += len(data)
            got.extend(self.reader.feed(data))
            if len(data) < (1 << 20):
                break
        return got

    def close(self) -> None:
        """Closes the socket, once; an error while closing it is ignored."""
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass


def listen(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A TCP socket listening on `host`:`port` (port 0: a free one)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(128)
    return s


class Acceptor:
    """Accepts connections on `listener` and runs their handshakes on threads of its own, at
    most MAX_PENDING_HANDSHAKES at once, each within HANDSHAKE_TIMEOUT_S: an event loop never
    waits on a peer that sends nothing. What passed the handshake is queued as (socket,
    address, identity); `wakeup` becomes readable whenever something was queued, so that a
    selector can watch it beside its connections (`take` empties both)."""

    def __init__(self, listener: socket.socket, secret: bytes, name: str) -> None:
        self.listener = listener
        self.secret = secret
        self.refused = 0
        """Connections closed: over the cap, or failing the handshake."""
        self._ready: queue.SimpleQueue = queue.SimpleQueue()
        self._slots = threading.BoundedSemaphore(MAX_PENDING_HANDSHAKES)
        self.wakeup, self._wake = socket.socketpair()
        self.wakeup.setblocking(False)
        self._stop = threading.Event()
        listener.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept, name=f"{name}-accept", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, addr = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                self.refused += 1
                refuse(sock, addr, AuthError(f"{MAX_PENDING_HANDSHAKES} handshakes already pending"))
                continue
            threading.Thread(target=self._handshake, args=(sock, addr), daemon=True).start()

    def _handshake(self, sock: socket.socket, addr: object) -> None:
        try:
            ident = accept_handshake(sock, self.secret)
        except AuthError as e:
            self._slots.release()  # first: once it is counted, its slot is free
            self.refused += 1
            refuse(sock, addr, e)
            return
        self._slots.release()
        self._ready.put((sock, addr, ident))
        try:
            self._wake.send(b"x")
        except OSError:
            pass  # closed: nobody takes it any more

    def take(self, timeout: float = 0.0) -> list[tuple[socket.socket, object, dict]]:
        """The connections that passed the handshake since the last call (waits up to
        `timeout` for the first)."""
        got = []
        if timeout > 0:
            try:
                got.append(self._ready.get(timeout=timeout))
            except queue.Empty:
                return got
        # the wake-up bytes go first: one sent after this still finds its connection queued
        try:
            while self.wakeup.recv(4096):
                pass
        except (BlockingIOError, InterruptedError, OSError):
            pass
        try:
            while True:
                got.append(self._ready.get_nowait())
        except queue.Empty:
            pass
        return got

    def close(self) -> None:
        """Stops accepting, closes the listener and what was queued but never taken."""
        self._stop.set()
        self._thread.join(timeout=1)
        try:
            self.listener.close()
        except OSError:
            pass
        for sock, _, _ in self.take():
            sock.close()
        self.wakeup.close()
        self._wake.close()


def refuse(sock: socket.socket, addr: object, err: BaseException) -> None:
    """Closes a connection that failed the handshake, and logs it."""
    log.warning("refused connection from %s: %s", addr, err)
    try:
        sock.close()
    except OSError:
        pass


__all__ = [
    "Acceptor",
    "Connection",
    "FrameError",
    "accept_handshake",
    "connect",
    "connect_handshake",
    "listen",
    "refuse",
]
