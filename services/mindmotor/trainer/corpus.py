"""The training corpus: the text or source files the user names (files or directories), or, when
none are named, the Python standard library's own `.py` sources on this machine (nothing is
downloaded).

Documents are read in sorted path order, so the same files always give the same corpus and the
same digest. Files that are not UTF-8 text are skipped.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from .config import ConfigError

# Stdlib directories left out of the default corpus: test suites and installed third-party code.
STDLIB_EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test",
                        "__pycache__"}


@dataclass(frozen=True)
class Document:
    path: str
    text: str


def stdlib_sources() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py")
                  if p.is_file() and not STDLIB_EXCLUDED_DIRS & set(p.relative_to(root).parts))


def corpus_files(corpus: tuple[str, ...] | list[str]) -> list[Path]:
    """The files a corpus spec names, sorted; a missing path is a `ConfigError`."""
    if not corpus:
        return stdlib_sources()
    files: list[Path] = []
    for entry in corpus:
        path = Path(entry).expanduser()
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(p for p in sorted(path.rglob("*"))
                         if p.is_file() and not _hidden(p.relative_to(path)))
        else:
            raise ConfigError(f"corpus path {entry!r} does not exist")
    return sorted(set(files))


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") or part == "__pycache__" for part in relative.parts)


def check_corpus(corpus: tuple[str, ...] | list[str]) -> list[Path]:
    """Refuse a corpus that does not exist or holds no non-empty file (cheap: sizes only)."""
    files = corpus_files(corpus)
    if not any(f.stat().st_size > 0 for f in files):
        where = ", ".join(corpus) if corpus else "the Python standard library"
        raise ConfigError(f"corpus is empty: no non-empty file in {where}")
    return files


def read_documents(corpus: tuple[str, ...] | list[str], max_bytes: int = 0) -> list[Document]:
    """The UTF-8 text of every corpus file (up to `max_bytes` in total when it is > 0)."""
    documents, total = [], 0
    for path in check_corpus(corpus):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip() or "\x00" in text:
            continue
        if max_bytes and total + len(text) > max_bytes and documents:
            break
        documents.append(Document(str(path), text))
        total += len(text)
    if not documents:
        raise ConfigError("corpus is empty: no file holds UTF-8 text")
    return documents


def corpus_digest(documents: list[Document]) -> str:
    """sha256 over the documents' contents in order (paths excluded: moving files keeps it)."""
    digest = hashlib.sha256()
    for doc in documents:
        digest.update(hashlib.sha256(doc.text.encode()).digest())
    return digest.hexdigest()
