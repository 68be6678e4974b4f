"""An HTTPS reverse proxy in front of the dev cluster's kube-apiserver that can stall WATCH streams without closing
them: what a load balancer or NAT that silently dropped a connection's state looks like to the client.

The operator's kubeconfig points at the proxy; the proxy terminates TLS with the API server's own serving
certificate (its names include 127.0.0.1, so the client's verification against the cluster CA holds) and sends
every request on to the API server over TLS, the bearer token unchanged, so authentication and RBAC are the API
server's. :meth:`WatchStallingProxy.stall` makes every WATCH whose path contains a given text stop forwarding:
streams already open get no further byte, and new ones are accepted but never answered, until
:meth:`WatchStallingProxy.resume`. Requests that are not WATCHes pass, so the client's LISTs and writes still work.

Built on aiohttp's server and client (https://docs.aiohttp.org/en/stable/web_lowlevel.html), in a thread of its
own with its own event loop. Client certificates are not forwarded: the proxy serves token kubeconfigs only.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Mapping
from pathlib import Path

import aiohttp
from aiohttp import web

#: Headers of one hop (RFC 9110, section 7.6.1) and those aiohttp sets itself: never copied across the proxy.
_HOP_HEADERS = frozenset(
    h.lower()
    for h in ("Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Transfer-Encoding", "Upgrade",
              "Host", "Content-Length")
)  # fmt: skip
#: Seconds to wait for the proxy to listen, or to stop.
START_TIMEOUT_S = 10.0


def _copied(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}


def is_watch(request: web.BaseRequest) -> bool:
    """Whether ``request`` is a Kubernetes WATCH (``?watch=true`` or ``1``)."""
    return request.query.get("watch", "").lower() in ("true", "1")


class WatchStallingProxy:
    """A reverse proxy from ``https://127.0.0.1:<port>`` to ``upstream`` (see the module docstring).

    Args:
        upstream: the API server's URL (``https://127.0.0.1:6443``).
        pki: the dev cluster's PKI directory (``ca.crt``, ``apiserver.crt``, ``apiserver.key``).
        port: the port to listen on (0: a free one).

    Attributes:
        url: where it listens, once :meth:`start` returned.
        watches: WATCH streams open now whose path contains the stalled text (or any, when none is stalled).
    """

    def __init__(self, upstream: str, pki: Path, port: int = 0) -> None:
        self.upstream, self.pki, self.port = upstream.rstrip("/"), pki, port
        self.url = ""
        self._stalled = ""  # the path text of the stalled watches; "" while nothing is stalled
        self._open: dict[int, str] = {}  # id(request) -> path of the open WATCH streams
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="api-proxy", daemon=True)
        self._resumed: asyncio.Event | None = None
        self._runner: web.BaseRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- control, from any thread ----------------------------------------------------------------------------------

    def start(self) -> WatchStallingProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(START_TIMEOUT_S)
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(START_TIMEOUT_S)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(START_TIMEOUT_S)

    def stall(self, path_contains: str) -> None:
        """From now on, WATCHes whose path contains ``path_contains`` forward nothing (open and new ones)."""
        if not path_contains:
            raise ValueError("path_contains must name what to stall (e.g. 'batchedmodels')")
        self._loop.call_soon_threadsafe(self._set_stall, path_contains)

    def resume(self) -> None:
        """Stalled WATCHes forward again (what the API server sent meanwhile comes through)."""
        self._loop.call_soon_threadsafe(self._set_stall, "")

    def watches(self, path_contains: str) -> int:
        """WATCH streams open now (answered or held) whose path contains ``path_contains``."""
        return sum(path_contains in p for p in list(self._open.values()))

    def __enter__(self) -> WatchStallingProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- the event loop's side -------------------------------------------------------------------------------------

    def _set_stall(self, text: str) -> None:
        assert self._resumed is not None
        self._stalled = text
        if text:
            self._resumed.clear()
        else:
            self._resumed.set()

    async def _start(self) -> None:
        self._resumed = asyncio.Event()
        self._resumed.set()
        upstream_tls = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        # auto_decompress off: bodies pass as the API server encoded them, with their Content-Encoding
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=upstream_tls),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=START_TIMEOUT_S),
        )
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(str(self.pki / "apiserver.crt"), str(self.pki / "apiserver.key"))
        serving.set_alpn_protocols(["http/1.1"])
        # a client that goes away cancels its request's handler (a held WATCH would otherwise wait for ever), and a
        # stop does not wait for the long WATCHes to end
        server = web.Server(self._handle, handler_cancellation=True)
        self._runner = web.ServerRunner(server, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=serving)
        await site.start()
        sockets = self._runner.addresses
        self.url = f"https://127.0.0.1:{sockets[0][1]}"

    async def _stop(self) -> None:
        self._set_stall("")
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _held(self, request: web.BaseRequest) -> None:
        """Wait while ``request`` is a stalled WATCH."""
        assert self._resumed is not None
        while self._stalled and self._stalled in request.path:
            await self._resumed.wait()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        assert self._session is not None
        watch = is_watch(request)
        if watch:
            self._open[id(request)] = request.path
        try:
            if watch:
                await self._held(request)
            body = await request.read()
            async with self._session.request(
                request.method, self.upstream + request.path_qs, headers=_copied(request.headers),
                data=body or None, allow_redirects=False,
                # a body without Content-Type (the kubernetes client's POSTs) must stay so, not become
                # application/octet-stream, which the API server refuses (HTTP 415)
                skip_auto_headers=("Content-Type",),
            ) as upstream:  # fmt: skip
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                response.headers.update(_copied(upstream.headers))
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    if watch:
                        await self._held(request)
                    await response.write(chunk)
                await response.write_eof()
                return response
        finally:
            self._open.pop(id(request), None)
