"""The nameserver on a pod's loopback: "no such name" for every question, at once.

A pod resolves cluster names from its hosts file (``podnames.py``); what the file lacks goes to the
nameserver of its resolv.conf, 127.0.0.1 in its own network namespace. With nothing listening there glibc
reports "try again" (``EAI_AGAIN``), where a cluster's DNS answers "no such name" (NXDOMAIN, ``EAI_NONAME``)
for a name it does not hold, or for the reverse lookup of an address it has no record of. Programs notice the
difference: torch's c10d warns on every rank when the reverse lookup of a peer says "try again", and says
nothing on NXDOMAIN, where it shows the address. So each pod network namespace gets a UDP socket on
127.0.0.1:53 that answers NXDOMAIN to every query; the sandbox's event loop serves all of them.

The socket is made inside the pod's namespace by a short-lived thread that joins it (``setns`` changes only
the calling thread's namespace) and ends; a socket stays in the namespace it was made in, wherever it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import socket
import struct
import threading

CLONE_NEWNET = 0x40000000
HEADER = struct.Struct("!HHHHHH")
NXDOMAIN = 3
FORMERR = 1


def reply(query: bytes) -> bytes | None:
    """The answer to one DNS query: its question back with NXDOMAIN (FORMERR when the question cannot be
    read); None for what is not a query (too short, or a response)."""
    if len(query) < HEADER.size:
        return None
    ident, flags, qdcount, _, _, _ = HEADER.unpack_from(query)
    if flags & 0x8000:  # a response: never answer one (no loops between resolvers)
        return None
    end = _question_end(query) if qdcount == 1 else None
    opcode_rd = flags & 0x7900  # the opcode and "recursion desired" are echoed
    rcode = NXDOMAIN if end is not None else FORMERR
    question = query[HEADER.size:end] if end is not None else b""
    # QR (a response), AA (this server holds the cluster's names), RA, and the code
    header = HEADER.pack(ident, 0x8000 | 0x0400 | 0x0080 | opcode_rd | rcode, 1 if question else 0, 0, 0, 0)
    return header + question


def _question_end(query: bytes) -> int | None:
    at = HEADER.size
    while at < len(query):
        length = query[at]
        if length == 0:
            at += 1 + 4  # the root label, then QTYPE and QCLASS
            return at if at <= len(query) else None
        if length & 0xC0:  # a compression pointer has no place in a question
            return None
        at += 1 + length
    return None


def socket_in(netns: str, host: str = "127.0.0.1", port: int = 53) -> socket.socket:
    """A non-blocking UDP socket bound to ``host:port`` inside the network namespace file ``netns``."""
    made: list[socket.socket | BaseException] = []

    def join_and_bind() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(netns, os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({netns}): {os.strerror(err)}")
            finally:
                os.close(fd)
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((host, port))
            sock.setblocking(False)
            made.append(sock)
        except BaseException as exc:  # handed to the caller's thread
            made.append(exc)

    thread = threading.Thread(target=join_and_bind, name="poddns-setns")
    thread.start()
    thread.join()
    (result,) = made
    if isinstance(result, BaseException):
        raise result
    return result


class PodResolvers:
    """The NXDOMAIN nameserver of every pod network namespace, served from the sandbox's event loop."""

    def __init__(self) -> None:
        self._sockets: dict[str, socket.socket] = {}

    def open(self, pod_uid: str, netns: str) -> None:
        """Answer on 127.0.0.1:53 in ``netns`` from now on (call on the event loop)."""
        sock = socket_in(netns)
        self._sockets[pod_uid] = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._answer, sock)

    @staticmethod
    def _answer(sock: socket.socket) -> None:
        while True:
            try:
                query, peer = sock.recvfrom(4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the namespace is going away
                return
            answer = reply(query)
            if answer is not None:
                with contextlib.suppress(OSError):  # the asker left: as with any lost datagram
                    sock.sendto(answer, peer)

    def close(self, pod_uid: str) -> None:
        """Stop answering for a pod (before its namespace is removed)."""
        sock = self._sockets.pop(pod_uid, None)
        if sock is not None:
            with contextlib.suppress(RuntimeError):  # no loop any more: closing the socket is all that is left
                asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()

    def close_all(self) -> None:
        """Stop answering for every pod."""
        for uid in list(self._sockets):
            self.close(uid)
