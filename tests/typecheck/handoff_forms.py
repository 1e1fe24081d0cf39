"""Hand-off sections and ``wait_external_semaphores`` as typed, for ``mypy --strict`` (listed
in ``[tool.mypy] files``; never run, see ``docs_examples.py``).

What type-checks here runs too (tests/test_handoff_entries.py): an empty list of waits or of
signals is a section that hands off in one direction only, not an error at run time. What mypy
refuses is marked ``type: ignore[...]``; ``warn_unused_ignores`` (part of ``--strict``) fails
the check if it stops refusing it.
"""

from __future__ import annotations

from typing import assert_type

import aiocudasem as acs


async def one_way_sections(
    stream: acs.Stream, ready: acs.ExternalSemaphore, done: acs.ExternalSemaphore, n: int
) -> None:
    async with stream.handoff(acs.Wait(ready, n), []) as s:  # wait for a producer only
        assert_type(s, acs.Stream)
    async with stream.handoff([], acs.Signal(done, n)):  # signal a consumer only
        pass
    async with stream.handoff((), ()):  # the body, then the stream's completion
        pass
    waits: list[acs.Wait] = []  # built at run time, perhaps empty
    signals: tuple[acs.Signal, ...] = ()
    assert_type(stream.handoff(waits, signals), acs.HandOff)
    await acs.wait_external_semaphores([], stream)
    await acs.wait_external_semaphores(waits, stream.handle)


def refused(stream: acs.Stream, ready: acs.ExternalSemaphore, done: acs.ExternalSemaphore) -> None:
    stream.handoff(ready, done)  # type: ignore[arg-type]
    stream.handoff(acs.Signal(done, 1), acs.Wait(ready, 1))  # type: ignore[arg-type]
    stream.handoff([acs.Wait(ready, 1)], [acs.Wait(ready, 2)])  # type: ignore[list-item]
