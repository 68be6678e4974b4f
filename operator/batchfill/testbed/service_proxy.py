"""One Service port as kube-proxy serves it: a TCP proxy that picks a ready endpoint per connection.

kube-proxy balances *connections* to a ClusterIP Service (iptables mode picks an endpoint at random when a
connection opens, ipvs mode round-robin), never requests: a gRPC client's HTTP/2 connection stays on the pod it
was given. kube-proxy cannot run on the test bed's nodes (README.md, "On real pods"), so tests that measure that
behaviour put this proxy in its place: it listens on loopback, takes each new connection to the next endpoint of
``endpoints()`` (read when the connection opens, e.g. :meth:`batchfill.testbed.balancer.ServiceEndpoints.endpoints`)
and copies bytes both ways until either side closes. Use as a context manager; :attr:`url` is ``host:port``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from batchfill.testbed.tcp_relay import relay


class ServiceProxy:
    """A loopback TCP listener forwarding each connection to one endpoint (``host:port``) chosen when it opens.

    Args:
        endpoints: the ready endpoints, read at each new connection; none: the connection is closed at once
            (as a Service without ready endpoints refuses it).
        host: the listening address (port chosen by the kernel).

    :attr:`connections` counts the connections given to each endpoint.
    """

    def __init__(self, endpoints: Callable[[], list[str]], host: str = "127.0.0.1") -> None:
        self.endpoints, self.host = endpoints, host
        self.port = 0
        self.connections: Counter[str] = Counter()
        self._turn = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        targets = self.endpoints()
        if not targets:
            writer.close()
            return
        target = targets[self._turn % len(targets)]
        self._turn += 1
        host, port = target.rsplit(":", 1)

        def given() -> None:
            self.connections[target] += 1

        with contextlib.suppress(asyncio.CancelledError):  # cancelled by __exit__: the relay closed both sides
            await relay(reader, writer, host, int(port), on_connected=given)

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()

        async def main() -> None:
            self._server = await asyncio.start_server(self._accept, self.host, 0)
            self.port = int(self._server.sockets[0].getsockname()[1])
            self._ready.set()
            async with self._server:
                await self._server.serve_forever()

        try:
            loop.run_until_complete(main())
        except asyncio.CancelledError:
            pass
        finally:
            # the relays cancelled by __exit__ finish (and close their sockets) before the loop goes
            pending = asyncio.all_tasks(loop)
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    def __enter__(self) -> ServiceProxy:
        self._thread = threading.Thread(target=self._run, name="service-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the service proxy did not start listening within 10 s")
        return self

    def __exit__(self, *exc_info: Any) -> None:
        loop, server = self._loop, self._server
        if loop is not None and server is not None and not loop.is_closed():

            def stop() -> None:
                server.close()
                for task in asyncio.all_tasks(loop):
                    task.cancel()

            loop.call_soon_threadsafe(stop)
        if self._thread is not None:
            self._thread.join(timeout=10)


__all__ = ["ServiceProxy"]
