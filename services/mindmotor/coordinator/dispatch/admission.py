"""`Admission`: at most `max_requests` outstanding choices per model (MindIE's `max_requests`);
beyond that a request is refused at once with 429 and `Retry-After`, never queued unboundedly.
A request whose choices alone exceed the limit could never be admitted: `planning` answers it
400 first (`request_rules.check_choices`)."""

from __future__ import annotations

from mindmotor.coordinator.http.errors import TooManyRequests
from mindmotor.coordinator.metrics import CoordinatorMetrics


class Admission:
    def __init__(self, max_requests: int, retry_after_s: float, metrics: CoordinatorMetrics):
        self.max_requests = max_requests
        self.retry_after_s = retry_after_s
        self.metrics = metrics
        self.outstanding: dict[str, int] = {}

    def admit(self, model: str, choices: int = 1) -> "Ticket":
        """Count `choices` against the model's limit until the ticket is released."""
        current = self.outstanding.get(model, 0)
        if current + choices > self.max_requests:
            self.metrics.rejected.labels("queue_full").inc()
            raise TooManyRequests(
                f"model {model!r} has {current} requests outstanding (limit {self.max_requests}); "
                "retry later", retry_after_s=self.retry_after_s, code="queue_full")
        self.outstanding[model] = current + choices
        self.metrics.outstanding.labels(model).set(current + choices)
        return Ticket(self, model, choices)

    def _release(self, model: str, choices: int) -> None:
        self.outstanding[model] -= choices
        self.metrics.outstanding.labels(model).set(self.outstanding[model])


class Ticket:
    """An admitted request's place; `release` (idempotent) gives it back."""

    def __init__(self, admission: Admission, model: str, choices: int):
        self._admission = admission
        self._model = model
        self._choices = choices
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._release(self._model, self._choices)
