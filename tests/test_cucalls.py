"""The C driver calls of the wait path (``aiocudasem._cucalls``), without a GPU: bad input is
refused before anything reaches the driver. tests/gpu/test_cuda.py drives them on the GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

from aiocudasem import _cucalls


def _raise(status: int, what: str) -> None:
    raise AssertionError(f"{what} {status}")  # pragma: no cover - never called here


@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        ((1, 2, 3, 4), TypeError, "takes 5 addresses and a callable"),
        ((0, 1, 1, 1, 1, _raise), ValueError, "NULL"),
        ((1, 1, 1, 1, -1, _raise), OverflowError, ""),
        ((1, 1, 1, "x", 1, _raise), TypeError, "a CUDA handle is an int, not str"),
        ((1, 1, 1, 1, 1, "not callable"), TypeError, "not callable"),
    ],
)
def test_bind_refuses_bad_input_and_binds_nothing(
    args: tuple[object, ...], exc: type[Exception], match: str
) -> None:
    with pytest.raises(exc, match=match or None):
        _cucalls.bind(*args)  # type: ignore[arg-type]


def test_calls_refuse_bad_handles_and_counts() -> None:
    # Bound (a CUDA driver was made in this process) or not, these never reach the driver.
    with pytest.raises((TypeError, RuntimeError)):
        _cucalls.event_query(1, 2)  # type: ignore[call-arg]
    with pytest.raises((OverflowError, RuntimeError)):
        _cucalls.event_query(-1)
    with pytest.raises((TypeError, RuntimeError)):
        _cucalls.stream_query(1.5)  # type: ignore[arg-type]
    with pytest.raises((ValueError, RuntimeError)):
        _cucalls.launch_host_func(1, 0, 0)  # a NULL host function


def test_unbind_makes_every_call_raise_the_given_reason() -> None:
    """What a forked child's driver does: forget the addresses and refuse with its reason, even
    for a function taken before (in a fresh process, so that no bound driver is touched)."""
    code = """if True:
        from aiocudasem import _cucalls

        query = _cucalls.event_query

        def refuse():
            raise OSError("refused: forked")

        _cucalls.unbind(refuse)
        for call, args in ((query, (1,)), (_cucalls.event_record, (1, 2)),
                           (_cucalls.launch_host_func, (1, 2, 3))):
            try:
                call(*args)
            except OSError as exc:
                assert "forked" in str(exc)
            else:
                raise SystemExit(f"{call} did not refuse")
        print("refused")
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "refused"


def test_unbind_needs_a_callable_and_bools_are_not_handles() -> None:
    with pytest.raises(TypeError, match="not callable"):
        _cucalls.unbind("no")  # type: ignore[arg-type]
    with pytest.raises((TypeError, RuntimeError)):
        _cucalls.stream_query(True)


def test_a_call_unbound_while_the_driver_ran_it_raises() -> None:
    """The enqueuing calls release the GIL, so the error factory that was bound when a call
    began may be gone when the driver's answer comes back (here a stand-in driver function
    unbinds): the failure raises instead of calling a NULL factory (in a fresh process, so
    that no bound driver is touched)."""
    code = """if True:
        import ctypes
        from aiocudasem import _cucalls

        def refuse():
            raise OSError("refused: forked")

        @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
        def record(event, stream):
            _cucalls.unbind(refuse)
            return 1  # CUDA_ERROR_INVALID_VALUE

        def fail(status, what):
            raise SystemExit("the factory of the unbound driver was called")

        address = ctypes.cast(record, ctypes.c_void_p).value
        _cucalls.bind(address, address, address, address, address, fail)
        try:
            _cucalls.event_record(1, 2)
        except RuntimeError as exc:
            assert "cuEventRecord failed (1)" in str(exc), exc
        else:
            raise SystemExit("event_record() did not raise")
        print("raised")
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "raised"
