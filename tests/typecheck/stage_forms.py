"""Host stages as typed, for ``mypy --strict`` (listed in ``[tool.mypy] files``; never run, see
``docs_examples.py``): ``await stage`` has the coroutine's return type, and the arguments are
checked against the function's, as anyio's ``start_soon()`` checks them. What mypy refuses is
marked ``type: ignore[...]``; ``warn_unused_ignores`` (part of ``--strict``) fails the check if
it stops refusing it.
"""

from __future__ import annotations

import functools
from typing import assert_type

import aiocudasem as acs


async def fetch(url: str, retries: int) -> bytes:
    return url.encode() * retries


async def send(data: bytes, *, flush: bool) -> None:
    pass


async def stages(stream: acs.Stream) -> None:
    stage = stream.enqueue_host(fetch, "http://example.com", 3)
    assert_type(stage, acs.HostStage[bytes])
    assert_type(await stage, bytes)
    assert_type(stage.done(), bool)
    assert_type(stage.cancel(), bool)
    done = stream.enqueue_host(functools.partial(send, b"x", flush=True))
    assert_type(await done, None)
    assert_type(await stream.enqueue_host(stream.wait_complete), None)
    stream.enqueue_host(fetch, "http://example.com")  # type: ignore[arg-type]
    stream.enqueue_host(fetch, 3, 3)  # type: ignore[arg-type]
