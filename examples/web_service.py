"""A small aiohttp service that awaits GPU work per request without blocking other requests.

Each request of ``GET /work?ms=100`` takes a stream from a pool, enqueues its GPU work there (a
kernel that runs ``ms`` milliseconds stands in for yours) and awaits the stream. While it
waits, the event loop serves other requests: eight such requests at once take about 100 ms in
all, not 800 ms. The pool's size caps how many requests use the GPU at once; the others queue.

    python examples/web_service.py --driver sim --port 8080
    curl 'http://127.0.0.1:8080/work?ms=100'

``--port 0`` picks a free port; the first line printed says which.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator

from aiohttp import web

import aiocudasem as acs
from aiocudasem.testing import workloads

POOL = web.AppKey("pool", asyncio.Queue[acs.Stream])


async def work(request: web.Request) -> web.Response:
    try:
        ms = float(request.query.get("ms", "10"))
    except ValueError:
        ms = -1.0
    if not 0 <= ms <= 10_000:
        raise web.HTTPBadRequest(text="ms must be a number of milliseconds in [0, 10000]\n")
    pool = request.app[POOL]
    stream = await pool.get()  # one request per stream at a time
    try:
        start = time.perf_counter()
        workloads(stream.driver).launch_spin(stream.handle, int(ms * 1e6))  # enqueue, at once
        async with asyncio.timeout(10 + ms / 1e3):
            await stream.wait_complete()  # other requests are served meanwhile
    except TimeoutError:
        raise web.HTTPGatewayTimeout(text="the GPU did not finish in time\n")
    finally:
        pool.put_nowait(stream)  # work still enqueued on it runs before the next request's
    return web.json_response({"ms": ms, "took_ms": (time.perf_counter() - start) * 1e3})


def make_app(driver: acs.Driver, streams: int) -> web.Application:
    async def stream_pool(app: web.Application) -> AsyncIterator[None]:
        owned = [acs.open_stream(driver=driver) for _ in range(streams)]
        app[POOL] = asyncio.Queue()
        for stream in owned:
            app[POOL].put_nowait(stream)
        yield
        for stream in owned:  # the server has stopped: close each stream after its work
            await stream.aclose()

    app = web.Application()
    app.cleanup_ctx.append(stream_pool)
    app.router.add_get("/work", work)
    return app


async def serve(driver_name: str | None, host: str, port: int, streams: int) -> None:
    driver = acs.get_driver(driver_name)  # None: $AIOCUDASEM_DRIVER, else the real GPU
    runner = web.AppRunner(make_app(driver, streams))
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        address = runner.addresses[0]
        print(f"serving on http://{address[0]}:{address[1]} (driver '{driver.name}')", flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()  # finishes the requests in flight, then closes the pool
    print("stopped", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A web service that awaits GPU work.")
    parser.add_argument("--driver", choices=["sim", "cuda"], default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--streams", type=int, default=16, help="size of the stream pool")
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.driver, args.host, args.port, args.streams))
    except acs.DriverUnavailableError as exc:
        sys.exit(
            f"failed: the CUDA driver cannot be used: {exc.reason} (--driver sim serves "
            "from the simulated device)"
        )
