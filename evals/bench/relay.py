"""The floor of one more HTTP hop: a bare aiohttp relay that forwards ``POST /v1/chat/completions``
to an upstream and streams its bytes back, with nothing else (no parsing, no audit).

    python evals/bench/relay.py http://127.0.0.1:PORT/v1

evals/bench/guard.py runs it next to ``rt4 guard --upstream``: what the guard's proxy adds beyond
what this relay adds is the guard's own overhead; the rest is the hop itself on this machine.
Prints ``serving on URL`` to stderr once it listens, as ``rt4 guard`` does.
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp
from aiohttp import web


async def main(upstream: str) -> None:
    http = aiohttp.ClientSession()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": "application/json"}
        async with http.post(upstream.rstrip("/") + "/chat/completions", data=body, headers=headers) as reply:
            response = web.StreamResponse(status=reply.status, headers={"Content-Type": reply.content_type})
            await response.prepare(request)
            async for chunk in reply.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", relay)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(f"relay: serving on http://127.0.0.1:{runner.addresses[0][1]}", file=sys.stderr, flush=True)
    try:
        await asyncio.Event().wait()  # until terminated
    finally:
        await http.close()
        await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
