"""`mindmotor simulate`: a cluster of emulated cards replaying a trace in emulated time.

Each instance is the real `LLMEngine` with the cost-only runner (no weights, no forward pass) on
the cluster's virtual clock; the coordinator's routing policies place requests; the device's cost
model says how long each step takes. See docs/emulator.md.
"""

from mindmotor.simulator.cluster import ClusterSpec
from mindmotor.simulator.simulator import SimulationResult, simulate
from mindmotor.simulator.trace import TraceRequest, load_trace

__all__ = ["ClusterSpec", "SimulationResult", "simulate", "TraceRequest", "load_trace"]
