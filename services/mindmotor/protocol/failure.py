"""What a worker says about a call it fails, beyond the status code: the trailing metadata
`mindmotor-failure` of an INTERNAL or UNAVAILABLE answer to Generate or Prefill.

- `request`: the engine raised while serving this request; the request alone failed, the worker
  serves on (the caller may try another instance, but should not hold it against this one).
- `engine`: this worker's engine has died (it stops serving and exits); the request may be
  what killed it.

The trailing metadata `mindmotor-param` of an INVALID_ARGUMENT answer names the request field at
fault (OpenAI's `param`), when the worker knows it.
"""

FAILURE_METADATA_KEY = "mindmotor-failure"
PARAM_METADATA_KEY = "mindmotor-param"
REQUEST_FAILED = "request"
ENGINE_DEAD = "engine"
