"""aiocudasem: CUDA external semaphores and stream completion for async Python.

Enqueue semaphore waits and signals on CUDA streams (synchronous, non-blocking), then ``await``
the GPU from asyncio or trio, through a GIL-free C host function routed to the event loop.
"""

from ._dlpack import ready as ready
from ._driver import DRIVER_ENV as DRIVER_ENV
from ._driver import Driver as Driver
from ._driver import get_driver as get_driver
from ._entries import Signal as Signal
from ._entries import Wait as Wait
from ._errors import AbandonedError as AbandonedError
from ._errors import AiocudasemError as AiocudasemError
from ._errors import CudaError as CudaError
from ._errors import DeviceFaultError as DeviceFaultError
from ._errors import DeviceMismatchError as DeviceMismatchError
from ._errors import DriverUnavailableError as DriverUnavailableError
from ._errors import StageCancelledError as StageCancelledError
from ._errors import UnsupportedFeatureError as UnsupportedFeatureError
from ._errors import UnsupportedHandleTypeError as UnsupportedHandleTypeError
from ._errors import VulkanError as VulkanError
from ._errors import VulkanUnavailableError as VulkanUnavailableError
from ._events import Event as Event
from ._events import IpcEvent as IpcEvent
from ._events import IpcEventHandle as IpcEventHandle
from ._events import create_ipc_event as create_ipc_event
from ._events import open_ipc_event as open_ipc_event
from ._events import wait_event as wait_event
from ._graphs import add_signal_node as add_signal_node
from ._graphs import add_wait_node as add_wait_node
from ._graphs import launch_graph as launch_graph
from ._graphs import set_signal_node as set_signal_node
from ._graphs import set_wait_node as set_wait_node
from ._graphs import signal_nodes as signal_nodes
from ._graphs import wait_nodes as wait_nodes
from ._handles import HandleType as HandleType
from ._notifier import Tuning as Tuning
from ._notifier import configure as configure
from ._processes import receive_host_timeline as receive_host_timeline
from ._processes import receive_semaphore as receive_semaphore
from ._processes import send_host_timeline as send_host_timeline
from ._processes import send_semaphore as send_semaphore
from ._public import publish as _publish
from ._records import IpcRecorder as IpcRecorder
from ._records import IpcRecords as IpcRecords
from ._records import create_ipc_recorder as create_ipc_recorder
from ._records import receive_ipc_records as receive_ipc_records
from ._records import send_ipc_recorder as send_ipc_recorder
from ._semaphore import ExternalSemaphore as ExternalSemaphore
from ._semaphore import import_semaphore as import_semaphore
from ._stages import HostStage as HostStage
from ._stream import HandOff as HandOff
from ._stream import Stream as Stream
from ._stream import open_stream as open_stream
from ._stream import wait_external_semaphores as wait_external_semaphores
from ._stream import wait_stream as wait_stream
from ._timeline import HostTimeline as HostTimeline
from ._timeline import create_host_timeline as create_host_timeline
from ._timeline import open_host_timeline as open_host_timeline

__version__ = "0.1.0"

__all__ = (
    "DRIVER_ENV",
    "AbandonedError",
    "AiocudasemError",
    "CudaError",
    "DeviceFaultError",
    "DeviceMismatchError",
    "Driver",
    "DriverUnavailableError",
    "Event",
    "ExternalSemaphore",
    "HandOff",
    "HandleType",
    "HostStage",
    "HostTimeline",
    "IpcEvent",
    "IpcEventHandle",
    "IpcRecorder",
    "IpcRecords",
    "Signal",
    "StageCancelledError",
    "Stream",
    "Tuning",
    "UnsupportedFeatureError",
    "UnsupportedHandleTypeError",
    "VulkanError",
    "VulkanUnavailableError",
    "Wait",
    "add_signal_node",
    "add_wait_node",
    "configure",
    "create_host_timeline",
    "create_ipc_event",
    "create_ipc_recorder",
    "get_driver",
    "import_semaphore",
    "launch_graph",
    "open_host_timeline",
    "open_ipc_event",
    "open_stream",
    "ready",
    "receive_host_timeline",
    "receive_ipc_records",
    "receive_semaphore",
    "send_host_timeline",
    "send_ipc_recorder",
    "send_semaphore",
    "set_signal_node",
    "set_wait_node",
    "signal_nodes",
    "wait_event",
    "wait_external_semaphores",
    "wait_nodes",
    "wait_stream",
)

_publish(__name__, globals(), __all__)
