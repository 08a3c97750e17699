"""The redaction helper and the secret readers on their own: URL passwords and registered secrets
masked in text, in structures and in every part of a JSON log line (message, arguments, extra
fields, traceback); secrets read from files (first line / one a line) and the environment, a
missing or empty file an error that names the file and never its content."""

from __future__ import annotations

import io
import json
import logging

import pytest

from mindmotor.common.logging import setup_logging
from mindmotor.common.redact import redact, redact_value, register_secret, register_url
from mindmotor.common.secrets import secret, secret_list

from .public_side_support import token


@pytest.mark.parametrize("text, expected", [
    ("redis at redis://:hunter2@10.0.0.3:6379/0: ConnectionError", "redis at redis://:***@10.0.0.3:6379/0: ConnectionError"),
    ("rediss://default:s3cr%40t@cache:6380/1", "rediss://default:***@cache:6380/1"),
    ("url='redis://user:p@ss@h:1/0'", "url='redis://user:***@h:1/0'"),
    ("redis://h:6379/0?password=abc&db=1", "redis://h:6379/0?password=***&db=1"),
    ("redis://127.0.0.1:6379/0 and http://host:8000/v1", "redis://127.0.0.1:6379/0 and http://host:8000/v1"),
    ("redis://user@h:1/0", "redis://user@h:1/0"),
])
def test_url_passwords_are_masked_and_nothing_else(text, expected):
    assert redact(text) == expected


def test_registered_secrets_are_masked_anywhere():
    value = token("tok")
    assert redact(f"token {value}!") == f"token {value}!"
    register_secret(value)
    assert redact(f"token {value}!") == "token ***!"
    password = token("pw")
    register_url(f"redis://:{password}@h:1/0")
    assert redact(f"AUTH {password}") == "AUTH ***"
    assert redact_value({"a": [f"x{password}", 3, None], "b": (value,), "c": ValueError(value)}) == \
        {"a": ["x***", 3, None], "b": ["***"], "c": "***"}
    register_secret("ab")                          # too short to mask without masking words
    assert redact("about") == "about"


def test_every_part_of_a_log_line_is_redacted():
    password = token("pw")
    stream = io.StringIO()
    setup_logging("test", "INFO", stream=stream)
    log = logging.getLogger("mindmotor.test.redact")
    try:
        url = f"redis://:{password}@10.0.0.9:6379/0"
        log.warning("redis at %s failed", url, extra={"error": f"StoreUnavailable: redis at {url}",
                                                      "nested": {"urls": [url]}, "exc_object": OSError(url)})
        try:
            raise ConnectionError(f"cannot reach {url}")
        except ConnectionError:
            log.exception("store down")
    finally:
        setup_logging("test", "INFO")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert password not in stream.getvalue()
    assert lines[0]["msg"] == "redis at redis://:***@10.0.0.9:6379/0 failed"
    assert lines[0]["error"] == "StoreUnavailable: redis at redis://:***@10.0.0.9:6379/0"
    assert lines[0]["nested"] == {"urls": ["redis://:***@10.0.0.9:6379/0"]}
    assert "redis://:***@" in lines[0]["exc_object"]
    assert "ConnectionError: cannot reach redis://:***@10.0.0.9:6379/0" in lines[1]["exc_info"]


def test_secrets_from_files_and_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MINDMOTOR_TEST_TOKEN", " from-env ")
    monkeypatch.setenv("MINDMOTOR_TEST_KEYS", "k-env-1, k-env-2,")
    token_file = tmp_path / "token"
    token_file.write_text("\n  from-file  \nsecond line\n")
    keys_file = tmp_path / "keys"
    keys_file.write_text("# rotated 2026-12-01\nk-file-1\n\nk-file-2\n")

    assert secret("token", env="MINDMOTOR_TEST_TOKEN") == "from-env"
    assert secret("token", flag="from-flag", env="MINDMOTOR_TEST_TOKEN") == "from-flag"
    assert secret("token", flag="from-flag", file=token_file, env="MINDMOTOR_TEST_TOKEN") == "from-file"
    assert secret("token", env="MINDMOTOR_NO_SUCH_VARIABLE") is None
    assert secret_list("keys", env="MINDMOTOR_TEST_KEYS") == ["k-env-1", "k-env-2"]
    assert secret_list("keys", values=["k-flag"], file=keys_file, env="MINDMOTOR_TEST_KEYS") == \
        ["k-flag", "k-file-1", "k-file-2"]
    assert redact("from-file k-file-2") == "*** ***"       # registered as they were read
    pw = token("pw")
    assert secret("Redis URL", flag=f"redis://:{pw}@h:1/0") == f"redis://:{pw}@h:1/0"
    assert secret("Redis URL", flag="redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact(f"AUTH {pw} at redis://127.0.0.1:6379/0") == "AUTH *** at redis://127.0.0.1:6379/0"


def test_a_bad_secret_file_is_an_error_naming_the_file_not_its_content(tmp_path):
    with pytest.raises(ValueError, match="cannot read the admin token file .*/missing"):
        secret("admin token", file=tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.write_text("\n# nothing but a comment\n")
    with pytest.raises(ValueError, match="API keys file .*/empty is empty"):
        secret_list("API keys", file=empty)
