"""The OpenAPI document against the server that publishes it: schemathesis generates requests for
every operation of `/openapi.json` (valid and invalid bodies, odd paths) and checks each answer —
never a 5xx, a status the operation declares, the declared content type, a body and headers its
schema accepts. A few examples per operation keep this bounded; `docs/operations.md` has the
long run. Also `/docs` (no asset from outside), HEAD on the health routes, `/invocations`."""

from __future__ import annotations

import re

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_headers_conformance,
                                 response_schema_conformance, status_code_conformance)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]


def test_the_server_answers_as_its_openapi_document_says(coordinator, model_name):
    """A few generated requests per operation (schemathesis' own pytest plugin does not run on
    this pytest: each operation is driven here with its hypothesis strategy)."""
    api = schemathesis.openapi.from_url(coordinator.url + "/openapi.json")
    failures = []
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) > 30
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=3, deadline=None, database=None, derandomize=True,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        def run(case):
            for name in ("model", "name"):       # the served model (an unknown one's 404 is tested elsewhere)
                if name in (case.path_parameters or {}):
                    case.path_parameters[name] = model_name
            if "version" in (case.path_parameters or {}):
                case.path_parameters["version"] = "1"
            if isinstance(case.body, dict) and isinstance(case.body.get("max_tokens"), int):
                case.body["max_tokens"] = min(case.body["max_tokens"], 4)    # bounded generations: fast
            case.call_and_validate(base_url=coordinator.url, checks=CHECKS, timeout=30)

        try:
            run()
        except Exception as exc:  # noqa: BLE001 - every operation's failure is reported together
            failures.append(f"{operation.method.upper()} {operation.path}: {exc}")
    assert not failures, "\n\n".join(failures)


@pytest.fixture(scope="module")
def http(coordinator):
    with httpx.Client(base_url=coordinator.url, timeout=60) as client:
        yield client


def test_openapi_declares_400_not_422(http):
    doc = http.get("/openapi.json").json()
    statuses = {s for ops in doc["paths"].values() for op in ops.values() for s in op["responses"]}
    assert "422" not in statuses and {"200", "400", "401", "404", "413", "429", "503"} <= statuses
    chat = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert chat["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert chat["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionResponse")
    assert "content" not in doc["paths"]["/ping"]["get"]["responses"]["200"]
    assert list(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]


def test_docs_are_served_without_the_internet(http):
    page = http.get("/docs")
    assert page.status_code == 200 and "SwaggerUIBundle" in page.text
    links = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert links and all(link.startswith("/docs/assets/") for link in links)
    assert not re.search(r"https?://(?!127\.0\.0\.1)", page.text)
    for link in links:
        assert http.get(link).status_code == 200


@pytest.mark.parametrize("path", ["/health", "/ready", "/ping", "/v2/health/live", "/v2/health/ready"])
def test_head_on_the_health_routes(http, path):
    head, get = http.head(path), http.get(path)
    assert head.status_code == get.status_code == 200 and head.content == b""


def test_invocations_route_by_body_shape(http, model_name):
    chat = http.post("/invocations", json={"model": model_name, "messages": [{"role": "user", "content": "hi"}],
                                           "max_tokens": 2})
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
    completion = http.post("/invocations", json={"model": model_name, "prompt": "hi", "max_tokens": 2})
    assert completion.status_code == 200 and completion.json()["object"] == "text_completion"
    neither = http.post("/invocations", json={"model": model_name})
    assert neither.status_code == 400 and "messages" in neither.json()["error"]["message"]
    bad = http.post("/invocations", json={"model": model_name, "prompt": "hi", "n": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "n"
