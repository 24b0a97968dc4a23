"""Running the application on uvicorn: the socket, and SIGTERM as a clean stop that exits 0."""

from __future__ import annotations

import signal
import socket
from types import FrameType

import uvicorn
from fastapi import FastAPI

from bertforge.errors import BertforgeError

BACKLOG = 2048  # connections the kernel holds before uvicorn accepts them
# seconds an idle keep-alive connection stays open (uvicorn's default is 5): a client reusing a connection as the
# server closes it sees a read error; on loaded cores timers fire late, and a benchmark client met one at 5 s
KEEP_ALIVE_SECONDS = 30


def bound_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one), so the address can be printed before serving."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, protocol)
    except OSError as error:
        raise BertforgeError(f"--host {host}: {error.strerror or error}; give an address of this machine, "
                             "e.g. 127.0.0.1") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as error:
        sock.close()
        raise BertforgeError(f"cannot listen on {host}:{port}: {error.strerror or error}; give another --port "
                             "(0: any free one) or stop what holds it") from None
    sock.listen(BACKLOG)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, but SIGTERM is a normal end: after its graceful shutdown (no new connections, every request
    in flight answered) the process exits 0 instead of uvicorn raising the signal again (exit -15). Ctrl-C keeps
    uvicorn's behaviour (a second one forces the exit)."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM:
            self.should_exit = True
            return
        super().handle_exit(sig, frame)


def serve_until_stopped(app: FastAPI, sock: socket.socket) -> None:
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=None,
                            access_log=False, timeout_keep_alive=KEEP_ALIVE_SECONDS)
    _Server(config).run(sockets=[sock])
