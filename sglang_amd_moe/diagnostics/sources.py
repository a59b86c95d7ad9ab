"""Installed packages and their source files, found and read without importing them."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import stat
from pathlib import Path

from sglang_amd_moe.runtime import env

MAX_SOURCE_BYTES = 4 * 1024 * 1024  # SGLang's topk.py is about 130 kB
_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device"}
_KINDS |= {stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO or pipe"}

#: Whether torch here is a ROCm build (None: no torch): the gate's own reading.
torch_is_rocm = env.on_rocm


class SourceError(Exception):
    """A source file that cannot be read (the message says why)."""


def read_source(path: Path) -> str:
    """Text of the regular file ``path`` (at most MAX_SOURCE_BYTES), else SourceError. It
    is opened non-blocking and checked first: a FIFO cannot hang it, nor /dev/zero fill
    memory."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st, data = os.fstat(fd), b""
            if not stat.S_ISREG(st.st_mode):
                kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a plain file")
                raise SourceError(f"{path} is not a regular file ({kind}): give the source file")
            if st.st_size > MAX_SOURCE_BYTES:
                too_big = f"{st.st_size} bytes, more than a source file (limit {MAX_SOURCE_BYTES})"
                raise SourceError(f"{path} is {too_big}")
            while len(data) <= MAX_SOURCE_BYTES and (
                chunk := os.read(fd, MAX_SOURCE_BYTES + 1 - len(data))
            ):
                data += chunk
        finally:
            os.close(fd)
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_SOURCE_BYTES:
        raise SourceError(f"{path} grew past {MAX_SOURCE_BYTES} bytes while being read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path} is not UTF-8 Python source ({exc.reason})") from exc


def text_or_none(path: Path) -> str | None:
    try:
        return read_source(path)
    except SourceError:
        return None


def package_dir(name: str) -> Path | None:
    """Directory of top-level package ``name`` (None: absent, blocked, or a bare directory
    on ``sys.path``)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locs = list(spec.submodule_search_locations or []) if spec else []
    if spec is None or (spec.origin in (None, "namespace") and locs):
        return None
    if locs or not spec.origin or spec.origin in ("built-in", "frozen"):
        return Path(locs[0]) if locs else None
    return Path(spec.origin).parent


def _provides(dist: md.Distribution, top: str) -> bool:
    """Whether ``dist``'s own file list names package ``top``."""
    try:
        files = dist.files or ()
    except Exception:
        return False
    return any(f.parts and f.parts[0] == top for f in files)


def distribution(top: str) -> tuple[str | None, str | None]:
    """(distribution name, version) providing top-level package ``top``."""
    # The distribution of the same name first: it is the usual case (sglang, aiter), and
    # reading its one file list is fast, where mapping every installed distribution's
    # files to their packages reads them all (about half a second with SGLang's).
    try:
        same = md.distribution(top)
    except Exception:
        same = None
    if same is not None and _provides(same, top) and same.version:
        return same.metadata["Name"] or top, same.version
    try:
        dists = md.packages_distributions().get(top) or [top]
    except Exception:
        dists = [top]
    for dist in dists:
        try:
            return dist, md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None, None
