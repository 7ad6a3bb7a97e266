"""Checks that a command's outputs can be written, made before it measures or trains: a run that
worked for minutes or hours and then cannot write its result loses it (one-line ``ConfigError``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from layerplan.errors import ConfigError


def writable_dir(path: str | Path, what: str) -> Path:
    """``path`` as a directory that exists (created here, with its parents) and takes a new file."""
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise ConfigError(f"{what} {d} is a file; name a directory")
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=d):
            pass
    except OSError as e:
        raise ConfigError(f"{what} {d}: cannot write there ({e.strerror or e})") from None
    return d


def writable_file(path: str | Path, what: str) -> Path:
    """``path`` as a file that can be written: not a directory, in a directory that takes a new file."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what} {p} is a directory; name a file")
    try:
        with tempfile.TemporaryFile(dir=p.parent):
            pass
    except OSError as e:
        raise ConfigError(f"{what} {p}: cannot write in {p.parent} ({e.strerror or e})") from None
    return p
