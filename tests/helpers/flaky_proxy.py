"""A fault injector in front of a real HTTP server: a TCP proxy that cuts chosen responses mid-body.

`FlakyProxy(upstream, pattern, cuts)` listens on a free port of 127.0.0.1 and relays every request to
`upstream` (e.g. the SeaweedFS S3 gateway). For the first `cuts` GETs whose path matches `pattern`
and whose answer is a 200 with a body, it relays the status line, the headers and only half of the
body, then closes both connections: what a client sees when the server dies or the network drops in
the middle of a download. Everything else passes through untouched. With `hide_length`, a cut
answer also loses its Content-Length header: the client reads to the close and cannot tell from
the framing that the body is short (an answer without a length, as some proxies send).

One request per connection keeps the parsing to a minimum: the request goes upstream with
`Connection: close` (not a signed header in SigV4, so signatures still hold), the server ends its
answer by closing, and the proxy closes the client's connection after it; the client sees
`Connection: close` in the answer and opens a new connection for its next request.
"""

from __future__ import annotations

import re
import socket
import threading
from urllib.parse import urlsplit

MIN_CUT_BODY = 4096  # smaller bodies pass whole: half of them would not be "the middle of a transfer"


def _read_head(connection: socket.socket) -> tuple[bytes, bytes]:
    """(the head up to and including the blank line, the bytes read after it); (b"", ...) at EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            return b"", data
        data += chunk
    end = data.index(b"\r\n\r\n") + 4
    return data[:end], data[end:]


def _header(head: bytes, name: str) -> str | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name.lower().encode():
            return value.strip().decode("latin-1")
    return None


def _read_at_least(connection: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = connection.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _without(head: bytes, *names: bytes) -> bytes:
    lines = [line for line in head.split(b"\r\n")[:-2] if line.partition(b":")[0].strip().lower() not in names]
    return b"\r\n".join([*lines, b"", b""])


def _with_connection_close(head: bytes) -> bytes:
    return _without(head, b"connection", b"keep-alive")[:-2] + b"Connection: close\r\n\r\n"


class FlakyProxy:
    """A TCP proxy on 127.0.0.1 that cuts the first `cuts` matching GET responses in the middle of their body."""

    def __init__(self, upstream: str, pattern: str, cuts: int, *, hide_length: bool = False) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.pattern = re.compile(pattern)
        self.cuts_left = cuts
        self.hide_length = hide_length  # cut answers lose Content-Length: the client reads to the close, unaware
        self.cut: list[tuple[str, int, int]] = []  # (request path, bytes relayed, Content-Length) of each cut
        self.requests: list[str] = []  # "METHOD PATH" of every request relayed
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="flaky-proxy", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> FlakyProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed = True
        self._listener.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:  # the listener was closed
                return
            threading.Thread(target=self._serve, args=(client,), name="flaky-proxy-connection", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            try:
                self._relay_one(client)
            except OSError:
                pass  # a peer went away: so does this connection

    def _relay_one(self, client: socket.socket) -> None:
        head, body = _read_head(client)
        if not head:
            return
        method, path = (head.split(b"\r\n", 1)[0].decode("latin-1").split(" ") + ["", ""])[:2]
        length = int(_header(head, "Content-Length") or 0)
        body += _read_at_least(client, length - len(body))  # a PUT's body: it goes upstream after the head
        with self._lock:
            self.requests.append(f"{method} {path}")
            cut = method == "GET" and self.cuts_left > 0 and self.pattern.search(path.split("?", 1)[0]) is not None
            self.cuts_left -= cut  # reserved now, so that concurrent downloads cut no more than `cuts` in all
        with socket.create_connection(self.upstream) as server:
            server.sendall(_with_connection_close(head) + body)
            if cut:
                answer, rest = _read_head(server)
                size = int(_header(answer, "Content-Length") or -1)
                if answer.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")) and size >= MIN_CUT_BODY:
                    rest += _read_at_least(server, size // 2 - len(rest))
                    if self.hide_length:
                        answer = _without(answer, b"content-length")
                    client.sendall(answer + rest[:size // 2])
                    with self._lock:
                        self.cut.append((path, size // 2, size))
                    return  # both connections close here, half-way through the body
                with self._lock:
                    self.cuts_left += 1  # an error or an empty object: not a transfer to cut
                client.sendall(answer + rest)
            while chunk := server.recv(65536):
                client.sendall(chunk)
