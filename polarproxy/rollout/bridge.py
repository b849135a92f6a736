"""The path from a network-less sandbox to the gateway: a Unix socket, relayed at both ends.

A sandbox with its own network namespace has a loopback of its own and cannot reach 127.0.0.1 on the
host. On the host, host_relay.py's `HostRelay` listens on a Unix socket of the episode's own and relays
each request that carries the episode's key to the gateway's TCP port; the socket's folder is bind-mounted
into that sandbox alone. Inside, `forward` (this file run as a
script, stdlib only, started before the harness) listens on 127.0.0.1:PORT, relays each connection to
the socket, runs the harness command as its child and exits with the harness's exit code. With PORT the
gateway's own port, the harness uses the same base URLs inside as outside.

    python3 bridge.py --socket /run/polarproxy/gateway.sock --port 8000 -- HARNESS ARGV...
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable

BUFFER = 65536


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy bytes from src to dst until src ends; then half-close dst so the other side sees the end."""
    try:
        while data := src.recv(BUFFER):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def relay(a: socket.socket, b: socket.socket) -> None:
    """Relay both ways between two connected sockets until both directions end; close both."""
    t = threading.Thread(target=_pump, args=(b, a), daemon=True)
    t.start()
    _pump(a, b)
    t.join()
    a.close()
    b.close()


def _serve(listener: socket.socket, dial: Callable[[], socket.socket], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        try:
            upstream = dial()
        except OSError:
            conn.close()
            continue
        threading.Thread(target=relay, args=(conn, upstream), daemon=True).start()


def _dial_unix(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        s.close()
        raise
    return s


def forward(socket_path: str, port: int, argv: list[str]) -> int:
    """Inside the sandbox: listen on 127.0.0.1:port -> socket_path, run argv, return its exit code."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    stop = threading.Event()
    threading.Thread(
        target=_serve, args=(listener, lambda: _dial_unix(socket_path), stop), daemon=True
    ).start()
    try:
        proc = subprocess.Popen(argv)
    except OSError as e:
        print(f"polarproxy bridge: cannot run {argv[0]!r}: {e.strerror or e}", file=sys.stderr)
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: proc.send_signal(s))
    rc = proc.wait()
    stop.set()
    listener.close()
    return 128 - rc if rc < 0 else rc


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Relay 127.0.0.1:PORT to a Unix socket; run a command.")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    ns = parser.parse_args(args)
    argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    if not argv:
        parser.error("no command after --")
    return forward(ns.socket, ns.port, argv)


if __name__ == "__main__":
    sys.exit(main())
