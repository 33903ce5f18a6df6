"""The websockets this server sends compress with zlib's fastest level (permessage-deflate, per socket).

Every socket compresses what it sends with its own compressor, so a fleet page's heatmap message (~36 KB of
numbers a tick when every cell changes) is compressed once per open page. At zlib's default level (6) that
took 1.8 ms a message on this machine, against 0.3 ms at level 1, for 26 % more bytes (7.9 against 10.0 KB;
bench/README.md, "Fleet page"). uvicorn has no option for it, so its websocket protocols' permessage-deflate
factory is replaced by one with the same settings uvicorn gives it (window bits, memLevel) plus the level.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from uvicorn.protocols.websockets import websockets_sansio_impl
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory

LEVEL = 1


class FastDeflateFactory(ServerPerMessageDeflateFactory):
    """uvicorn's permessage-deflate settings, compressing at LEVEL."""

    def __init__(self, *args: Any, compress_settings: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, compress_settings={**(compress_settings or {}), "level": LEVEL}, **kwargs)


@functools.cache
def use_fast_deflate() -> None:
    """From now on the server's websockets compress at LEVEL: uvicorn's default implementation (`--ws auto`
    with websockets installed), and its legacy one if this server runs it (not imported otherwise: deprecated)."""
    websockets_sansio_impl.ServerPerMessageDeflateFactory = FastDeflateFactory
    legacy = sys.modules.get("uvicorn.protocols.websockets.websockets_impl")
    if legacy is not None:
        legacy.ServerPerMessageDeflateFactory = FastDeflateFactory
