"""Structured outputs, shared by the coordinator, the worker and the helper processes: the
request's `Constraint` and its cheap limits (`constraint.py`, no native code), and the grammar
compiler (`compile.py`, llguidance), which runs only where a crash costs nothing but the request:
in a helper process (`mindmotor.sandbox`) or, once a helper has accepted the spec, on the engine's
large-stack compile thread (`engine/grammar.py`)."""
