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
import socket
import struct
from collections import deque

import msgpack

from nosync.errors import AuthError, FrameError
from nosync.runtime import frames

log = logging.getLogger("nosync.runtime.channels")

HELLO = b"NSY1"
NONCE = 32
MAC = 32
HANDSHAKE_TIMEOUT_S = 5.0
INITIAL_CREDITS = 64


def _mac(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"".join(parts), hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise AuthError("connection closed during the handshake")
        buf += chunk
    return bytes(buf)


def accept_handshake(sock: socket.socket, secret: bytes) -> dict:
    """Server side. Returns the client's identity; raises AuthError (the caller closes). The
    socket sends each frame at once (TCP_NODELAY), as `connect`'s does: with Nagle's algorithm
    a small frame waits for the acknowledgement of the one before, which a receiver that sends
    nothing back delays by up to 40 ms (Linux's delayed ACK)."""
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server_nonce = os.urandom(NONCE)
        sock.sendall(HELLO + server_nonce)
        (n,) = struct.unpack("<H", _recv_exact(sock, 2))
        ident_raw = _recv_exact(sock, n)
        client_nonce = _recv_exact(sock, NONCE)
        mac = _recv_exact(sock, MAC)
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
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        hello = _recv_exact(sock, len(HELLO) + NONCE)
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
        reply = _recv_exact(sock, MAC)
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


def refuse(sock: socket.socket, addr: object, err: BaseException) -> None:
    """Closes a connection that failed the handshake, and logs it."""
    log.warning("refused connection from %s: %s", addr, err)
    try:
        sock.close()
    except OSError:
        pass


__all__ = [
    "Connection",
    "FrameError",
    "accept_handshake",
    "connect",
    "connect_handshake",
    "listen",
    "refuse",
]
