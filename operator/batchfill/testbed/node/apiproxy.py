"""The API server as the kubelet of a real node sees it: ``127.0.0.1:<port>`` inside the node's network namespace,
relayed byte for byte to the API server on the root namespace's ``127.0.0.1`` (TLS passes through untouched, so
the API server authenticates the kubelet's own client certificate; its serving certificate names 127.0.0.1).

The process starts in the root namespace, makes its listening socket inside the node's namespace (a socket stays
in the namespace it was made in) and returns, so every connection it accepts there is relayed by a connection it
opens in the root namespace. Nothing else is reachable through it.

    python -m batchfill.testbed.node.apiproxy --netns bf-5-0 --listen-port 6443 --target-port 41234
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from batchfill.testbed.node.netns import entered
from batchfill.testbed.process import LOOPBACK
from batchfill.testbed.tcp_relay import relay


def command(netns: str, listen_port: int, target_port: int) -> list[str]:
    """The forwarder's command line (this interpreter)."""
    return [sys.executable, "-m", "batchfill.testbed.node.apiproxy", "--netns", netns,
            "--listen-port", str(listen_port), "--target-port", str(target_port)]  # fmt: skip


def listen_in(netns: str, port: int) -> socket.socket:
    """A listening TCP socket on ``127.0.0.1:port`` inside network namespace ``netns``."""
    with entered(netns):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((LOOPBACK, port))
    s.listen(128)
    s.setblocking(False)
    return s


async def serve(listener: socket.socket, target_port: int) -> None:
    """Relay every connection accepted on ``listener`` to ``127.0.0.1:target_port`` (this namespace), forever."""
    server = await asyncio.start_server(lambda r, w: relay(r, w, LOOPBACK, target_port), sock=listener)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="apiproxy", description=__doc__.splitlines()[0])
    p.add_argument("--netns", required=True)
    p.add_argument("--listen-port", type=int, required=True)
    p.add_argument("--target-port", type=int, required=True)
    args = p.parse_args(argv)
    if not Path(f"/run/netns/{args.netns}").exists():
        print(f"apiproxy: no network namespace {args.netns}", file=sys.stderr)
        return 1
    listener = listen_in(args.netns, args.listen_port)
    print(f"apiproxy: {args.netns} 127.0.0.1:{args.listen_port} -> 127.0.0.1:{args.target_port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(listener, args.target_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
