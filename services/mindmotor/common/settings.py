"""How every service is configured: `ServiceSettings`, a pydantic-settings class whose values come
from (highest first) the command line, `MINDMOTOR_*` environment variables, a YAML file
(`--config FILE.yaml`), then the class's defaults.

    class ControllerConfig(ServiceSettings):
        secrets: ClassVar = {"admin_token": "admin token"}      # admin_token_file holds it, if given
        port: int = Field(50050, ge=0, le=65535)
        admin_token: str | None = None
        admin_token_file: str | None = None

    FLAGS = Flags("mindmotor.controller.config:ControllerConfig")      # common/settings_flags.py
    FLAGS.add_config(parser)
    FLAGS.add(group, "--port", type=int, help="gRPC port (default: %(default)s)")
    config = FLAGS.load(args)        # ValueError (pydantic's ValidationError) for a bad value

- **Names.** A setting `heartbeat_interval_s` is `heartbeat_interval_s:` in the file and
  `MINDMOTOR_HEARTBEAT_INTERVAL_S` in the environment (an empty variable counts as unset); a
  nested one (`engine.max_num_seqs`) is a mapping in the file and `MINDMOTOR_ENGINE__MAX_NUM_SEQS`
  in the environment. A flag names the setting it sets (`--heartbeat-interval` sets
  `heartbeat_interval_s`); an absent flag (argparse default None) leaves the setting to the
  environment, the file or the default, and `--help` shows that default (common/settings_flags.py).
- **Files.** Unknown keys are refused (a typo fails at start-up, naming the key). A nested section
  changes only the keys it names (`engine: {max_num_seqs: 64}` keeps the other engine defaults).
- **Secrets** (tokens, a Redis URL with a password) are named in `secrets`; each has a
  `<name>_file` setting. The file wins over the value; either way the secret is registered for
  redaction (common/secrets.py). Put them in the environment or in files, not on command lines.
- **Errors**: `describe(exc)` gives one line per invalid setting (`port: Input should be less than
  or equal to 65535 (got 70000)`), never a secret's value (nor that of any setting named like one).

Lists given in the environment are comma-separated or JSON (`split_list`). Constructing a settings
class in code (`ControllerConfig(port=0)`, `model_validate`) reads the environment too;
`model_construct()` gives the plain defaults.
"""

from __future__ import annotations

import contextvars
import json
import re
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import ValidationError, model_validator
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from .settings_flags import ENV_PREFIX

_FILE_DATA: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("settings_file", default=None)


class ServiceSettings(BaseSettings):
    """The base of every service's settings (see the module doc)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", env_ignore_empty=True,
                                      extra="forbid", validate_default=True,
                                      nested_model_default_partial_update=True)

    secrets: ClassVar[dict[str, str]] = {}          # setting -> what it is ("admin token"), read from <setting>_file

    @classmethod
    def load(cls, config_file: str | Path | None = None, **overrides: Any):
        """Settings from `overrides` (the flags given; None values are left out), the environment,
        then `config_file` (YAML). ValueError (ValidationError) for bad values or a bad file,
        FileNotFoundError for a missing one."""
        data = read_settings_file(config_file) if config_file is not None else None
        token = _FILE_DATA.set(data)
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None})
        finally:
            _FILE_DATA.reset(token)

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
        data = _FILE_DATA.get()
        if data is not None:
            sources += (InitSettingsSource(settings_cls, init_kwargs=data),)
        return sources

    @model_validator(mode="after")
    def _read_secrets(self):
        """Every secret from its file (which wins over the value), registered for redaction."""
        from .secrets import secret

        for name, what in self.secrets.items():
            setattr(self, name, secret(what, getattr(self, name), getattr(self, f"{name}_file")))
        return self


def read_settings_file(path: str | Path) -> dict[str, Any]:
    """The mapping of a YAML settings file; FileNotFoundError, or ValueError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such config file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping of settings, not a {type(data).__name__}")
    return data


def split_list(value: Any) -> Any:
    """A list setting from the environment: JSON (`["a", "b"]`) or comma-separated (`a,b`)."""
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("["):
            return json.loads(value)
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


SECRET_WORDS = frozenset({"token", "key", "keys", "url", "password", "secret"})   # in a setting's name: never shown


def describe(exc: ValidationError, secrets: tuple[str, ...] = ()) -> str:
    """One line per invalid setting: `where: what (got value)`; the value is left out for
    `secrets`, for any setting named like one (SECRET_WORDS) and for anything long or structured."""
    lines = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        if not where:                                    # the settings as a whole (a model validator)
            lines.append(message)
            continue
        value = error.get("input")
        shown = ""
        if error["type"] != "missing" and isinstance(value, (str, int, float)) and len(str(value)) <= 80 \
                and not any(name in where for name in secrets) and not SECRET_WORDS & set(re.split(r"[._]", where)):
            shown = f" (got {value!r})"
        lines.append(f"{where}: {message}{shown}")
    return "\n".join(lines)


def error_text(exc: BaseException, settings: type[ServiceSettings] | None = None) -> str:
    """What a service logs when its settings do not load: `describe` for a ValidationError, the
    message for anything else (a missing file, a bad YAML)."""
    if isinstance(exc, ValidationError):
        return describe(exc, tuple(settings.secrets) if settings is not None else ())
    return str(exc)
