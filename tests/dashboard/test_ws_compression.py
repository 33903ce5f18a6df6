"""The server's websockets compress at zlib's fastest level (dashboard/ws_compression.py): each open fleet
page's socket compresses every heatmap message it is sent."""

from __future__ import annotations

import json
import random
import zlib

from uvicorn.protocols.websockets import websockets_sansio_impl
from websockets.frames import Frame, Opcode

import layercake.asgi  # noqa: F401  (the serving process imports it: that is where the level is set)
from dashboard.ws_compression import LEVEL, FastDeflateFactory


def heatmap_text() -> bytes:
    cells = [random.randint(0, 10) + 16 * 16 for _ in range(8000)]
    return json.dumps({"type": "fleet.heatmap", "cells": [1, 8000, *cells]}, separators=(",", ":")).encode()


def deflated_size(data: bytes, level: int) -> int:
    compressor = zlib.compressobj(level, zlib.DEFLATED, -12, 5)
    return len(compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)) - 4  # less the sync marker


def test_it_makes_the_servers_websockets_compress_at_the_fastest_level():
    assert websockets_sansio_impl.ServerPerMessageDeflateFactory is FastDeflateFactory
    factory = websockets_sansio_impl.ServerPerMessageDeflateFactory(
        server_max_window_bits=12, client_max_window_bits=12, compress_settings={"memLevel": 5}
    )
    _, extension = factory.process_request_params([("client_max_window_bits", None)], [])
    data = heatmap_text()
    sent = extension.encode(Frame(Opcode.TEXT, data))
    assert LEVEL == 1 and deflated_size(data, 1) != deflated_size(data, 6)
    assert len(sent.data) == deflated_size(data, 1)
