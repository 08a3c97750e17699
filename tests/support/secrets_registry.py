"""Every secret the test suite hands a service is registered here (`given_secret`,
`given_private_key`); at the end of the session tests/conftest.py greps every log file the
suite produced for all of them and fails the session on a hit (file and line, never the secret).

Importable from any test as `from secrets_registry import given_secret` (pytest's `pythonpath`
puts tests/support on sys.path)."""

from __future__ import annotations

from pathlib import Path

MIN_LENGTH = 8                  # shorter values would match innocent text
LOG_SUFFIXES = {".log", ".out", ".err", ".jsonl"}
KEY_MARKER = b"PRIVATE KEY-----"

_given: set[str] = set()


def given_secret(value: str) -> str:
    """Register `value` (an API key, token, password, Redis URL...) and return it unchanged."""
    if len(value) < MIN_LENGTH:
        raise ValueError(f"a registered secret needs at least {MIN_LENGTH} characters to be found unambiguously")
    _given.add(value)
    return value


def given_private_key(path: str | Path) -> Path:
    """Register the contents of a PEM private key file: its base64 lines after the first (the
    first is mostly the ASN.1 header every key of the same type shares)."""
    path = Path(path)
    lines = [line.strip() for line in path.read_text().splitlines() if line.strip() and "-----" not in line]
    for line in lines[1:]:
        if len(line) >= MIN_LENGTH:
            _given.add(line)
    return path


def registered() -> frozenset[str]:
    return frozenset(_given)


def hand_over(path: Path) -> None:
    """Write the registered secrets to `path` (a pytest-xdist worker, for its controller)."""
    path.write_text("".join(f"{value}\n" for value in sorted(_given)))


def take_over(root: Path) -> None:
    """Register the secrets the workers handed over (`hand_over`) into `root`."""
    for path in root.glob("secrets-*.txt"):
        _given.update(line for line in path.read_text().splitlines() if line)


def private_keys_under(root: Path) -> list[Path]:
    """PEM private key files under `root` (e.g. the PKIs `mindmotor up` and the fixtures made)."""
    found = []
    for path in root.rglob("*"):
        if path.suffix in {".pem", ".key"} and path.is_file():
            try:
                if KEY_MARKER in path.read_bytes()[:200]:
                    found.append(path)
            except OSError:
                continue
    return found


def log_files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.suffix in LOG_SUFFIXES and p.is_file()]


def find_leaks(files: list[Path], secrets: frozenset[str]) -> list[tuple[Path, int]]:
    """(file, line number) of every line holding one of `secrets`."""
    hits = []
    needles = [s.encode() for s in secrets]
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if not any(n in data for n in needles):
            continue
        for number, line in enumerate(data.splitlines(), 1):
            if any(n in line for n in needles):
                hits.append((path, number))
    return hits
