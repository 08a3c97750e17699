"""The rules a request must pass, in one place the coordinator, the worker, the engine and the
helper processes share — pure Python (no numpy, no llguidance, nothing of the engine), so the
front door validates exactly what a worker will: `request_rules` (the wire's and the model's
ranges, `InvalidRequest`), `sampling_params` (`SamplingParams`, each field checked on creation),
`constraint` (a structured output's `Constraint` and the limits its spec must keep)."""
