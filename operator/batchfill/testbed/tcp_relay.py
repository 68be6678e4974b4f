"""Byte-for-byte TCP relaying for the test bed's proxies (:mod:`batchfill.testbed.node.apiproxy`,
:mod:`batchfill.testbed.service_proxy`): one accepted connection joined to one connection opened upstream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

#: Copy buffer per read (bytes).
CHUNK = 1 << 16


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until end of stream or a connection error, then half-close ``writer``."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


async def relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    host: str,
    port: int,
    on_connected: Callable[[], None] | None = None,
) -> None:
    """Join the accepted connection (``reader``, ``writer``) to a new one to ``host:port`` both ways until both
    sides end; ``on_connected`` is called once the upstream connection is open. When ``host:port`` refuses, the
    accepted connection is closed."""
    try:
        up_reader, up_writer = await asyncio.open_connection(host, port)
    except OSError:
        writer.close()
        return
    if on_connected is not None:
        on_connected()
    try:
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
    finally:
        for w in (writer, up_writer):
            w.close()
