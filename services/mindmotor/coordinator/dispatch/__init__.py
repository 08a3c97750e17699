"""From a validated request to worker calls and back: planning (limits, the spec check, one
generation per choice), a choice's generation (retries, migration as a continuation, the
prefill/decode split, the progress guard), the fan-out of several choices, the response (JSON or
SSE, with resumable event ids) and admission."""
