"""Pieces for scripted HTTP/1.1 engines written with asyncio streams, for the node -> engine client tests."""

from __future__ import annotations

import asyncio


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body (by Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length) if length else b""


def ok(body: bytes, extra: bytes = b"") -> bytes:
    """A 200 answer with a JSON body and a Content-Length (`extra`: more header lines, each ending in CRLF)."""
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


LLAMA_CONTEXT_ERROR = {
    "error": {
        "code": 400,
        "message": "request (5031 tokens) exceeds the available context size (2048 tokens)",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 5031,
        "n_ctx": 2048,
    }
}
"""llama.cpp's own answer to a prompt past its context window, as its server sends it (HTTP 400)."""
