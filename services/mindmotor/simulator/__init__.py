"""`mindmotor simulate`: a cluster of emulated cards replaying a trace in emulated time.

The real scheduler, block manager and routing policies decide what runs; the device's cost model
says how long each step takes; no model forward runs. See docs/emulator.md.
"""

from mindmotor.simulator.cluster import ClusterSpec
from mindmotor.simulator.simulator import SimulationResult, simulate
from mindmotor.simulator.trace import TraceRequest, load_trace

__all__ = ["ClusterSpec", "SimulationResult", "simulate", "TraceRequest", "load_trace"]
