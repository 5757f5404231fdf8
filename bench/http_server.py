"""A minimal OpenAI-compatible chat-completions endpoint on 127.0.0.1 for the HTTP benchmarks.

One asyncio process, HTTP/1.1 keep-alive, a fixed latency per request (``asyncio.sleep``), and
the answer "ok": cheap enough that at concurrency 64 the client, not the server, is measured.
Run as ``python bench/http_server.py PORT LATENCY_S``; it prints ``ready`` once listening.
"""

from __future__ import annotations

import asyncio
import json
import sys

BODY = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "bench",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "ok"}}],
    "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21},
}).encode()
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(BODY)).encode() + b"\r\n\r\n")


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, latency: float):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:].strip())
            if length:
                await reader.readexactly(length)
            await asyncio.sleep(latency)
            writer.write(HEAD + BODY)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def main(port: int, latency: float) -> None:
    server = await asyncio.start_server(lambda r, w: handle(r, w, latency), "127.0.0.1", port,
                                        backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
