"""Calling into a loop from another thread: anyio's run_sync_soon() where anyio has it, the
loop's own thread-safe call before anyio 4.16, and nothing once the loop has ended."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from aiocudasem._loopcall import call_soon

pytestmark = pytest.mark.anyio


@dataclass
class _OldToken:
    """An EventLoopToken of an anyio whose backends have no run_sync_soon()."""

    backend_class: Any
    native_token: object


class _OldBackend:
    pass


@pytest.mark.parametrize("old_anyio", [False, True], ids=["anyio", "loop's own"])
async def test_call_soon_runs_in_the_loop_from_another_thread(old_anyio: bool) -> None:
    token: Any = anyio.lowlevel.current_token()
    if old_anyio:
        token = _OldToken(_OldBackend, token.native_token)
    here = threading.get_ident()
    ran = anyio.Event()
    seen: list[int] = []

    def fn() -> None:
        seen.append(threading.get_ident())
        ran.set()

    results: list[bool] = []
    thread = threading.Thread(target=lambda: results.append(call_soon(token, fn)))
    thread.start()
    with anyio.fail_after(5):
        await ran.wait()
    thread.join()
    assert results == [True]
    assert seen == [here]


@pytest.mark.parametrize("old_anyio", [False, True], ids=["anyio", "loop's own"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_call_soon_after_the_loop_ended_is_refused(backend: str, old_anyio: bool) -> None:
    async def grab() -> Any:
        return anyio.lowlevel.current_token()

    token = anyio.run(grab, backend=backend)
    if old_anyio:
        token = _OldToken(_OldBackend, token.native_token)
    called: list[int] = []
    assert call_soon(token, lambda: called.append(1)) is False
    assert called == []
