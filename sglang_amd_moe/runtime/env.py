"""Environment switches (all ``SGLANG_AMD_MOE_*``, read at call time) and the one gate both
hooks sit behind: not ``SGLANG_AMD_MOE_DISABLE``; a ROCm torch (``torch.version.hip``) or
``SGLANG_AMD_MOE_FORCE=1``; a Triton of at least :data:`MIN_TRITON`. Neither torch nor Triton
is imported to decide (importing torch takes seconds): their versions are read from files.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import re
import sys
from pathlib import Path

PREFIX = "SGLANG_AMD_MOE_"

#: The oldest Triton the kernels run on: the sort uses ``tl.gather`` (Triton 3.3).
MIN_TRITON: tuple[int, int] = (3, 3)
# Distributions that install the module `triton` (read when its file names no version).
_TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton-rocm", "pytorch-triton", "triton-rocm")
_VERSION_ASSIGNMENT = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.M)
_HIP_ASSIGNMENT = re.compile(r"^hip\s*(?::[^=\n]*)?=\s*(.+?)\s*$", re.M)


def flag(name: str) -> bool:
    """``SGLANG_AMD_MOE_<name>`` is 1/true/yes/on (any case)."""
    return os.environ.get(PREFIX + name, "").strip().lower() in {"1", "true", "yes", "on"}


def disabled() -> bool:
    """``SGLANG_AMD_MOE_DISABLE=1``: the plugin registers nothing."""
    return flag("DISABLE")


def forced() -> bool:
    """``SGLANG_AMD_MOE_FORCE=1``: register the hooks even when torch is not a ROCm build."""
    return flag("FORCE")


def guard_off() -> bool:
    """``SGLANG_AMD_MOE_GUARD=0`` (0/false/no/off): the guard at aiter's MoE entry stays off."""
    return os.environ.get(PREFIX + "GUARD", "").strip().lower() in {"0", "false", "no", "off"}


def stats_on() -> bool:
    """Not ``SGLANG_AMD_MOE_STATS=0`` (0/false/no/off): the guard and the mask count what they
    change, on the device (see ``runtime.stats``)."""
    return os.environ.get(PREFIX + "STATS", "").strip().lower() not in {"0", "false", "no", "off"}


def verify() -> bool:
    """``SGLANG_AMD_MOE_VERIFY=1``: check padded rows after every hooked call (a host sync)."""
    return flag("VERIFY")


def strict() -> bool:
    """``SGLANG_AMD_MOE_STRICT=1``: hook only bodies the ledger knows."""
    return flag("STRICT")


def _origin_text(package: str, name: str | None = None) -> tuple[Path | None, str]:
    """``package/__init__.py`` (or its sibling ``name``) of an importable top-level package
    and its text, without importing it (None: none, a namespace package, or one blocked with
    ``sys.modules[name] = None``; "": unreadable)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None, ""
    if spec is None or spec.origin in (None, "namespace"):
        return None, ""
    path = Path(spec.origin) if name is None else Path(spec.origin).with_name(name)
    try:
        return path, path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return path, ""


def on_rocm() -> bool | None:
    """The installed torch is a ROCm build (``torch.version.hip`` is set); None: no torch."""
    if "torch" not in sys.modules:
        origin, text = _origin_text("torch", "version.py")
        if origin is None:
            return None
        match = _HIP_ASSIGNMENT.search(text)
        try:
            if match:
                return bool(ast.literal_eval(match.group(1)))
        except (ValueError, SyntaxError):
            pass  # not a literal: ask torch itself
    try:
        import torch

        return bool(torch.version.hip)
    except Exception:  # no torch, or one that does not import
        return None


def triton_version() -> str | None:
    """The version of the importable ``triton`` module, without importing it (None: no
    ``triton`` module, or one blocked; "": one whose version cannot be read)."""
    if "triton" in sys.modules:
        mod = sys.modules["triton"]
        version = getattr(mod, "__version__", None)
        return None if mod is None else version if isinstance(version, str) else ""
    origin, text = _origin_text("triton")
    if origin is None:
        return None
    match = _VERSION_ASSIGNMENT.search(text)
    if match:
        return match.group(1)
    for dist in _TRITON_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def parse_version(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a version such as ``3.3.1+rocm6.4.1.git…``; None if unreadable."""
    match = re.match(r"\s*(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def triton_problem(version: str | None = None) -> str:
    """Why the installed Triton (or ``version``) cannot run the kernels ("" when it can)."""
    version = triton_version() if version is None else version
    need = ".".join(map(str, MIN_TRITON))
    if version is None:
        return (
            f"Triton is not installed (the kernels need Triton >= {need}; torch brings it: "
            "`triton` with CUDA torch, `pytorch-triton-rocm` with ROCm torch)"
        )
    parsed = parse_version(version)
    if parsed is None:
        return (
            f"the installed Triton's version ({version or 'none given'}) cannot be read "
            f"(the kernels need Triton >= {need})"
        )
    if parsed < MIN_TRITON:
        return (
            f"Triton {version} is older than {need}, which the kernels need (the sort uses "
            "tl.gather); install the torch build that brings a newer Triton"
        )
    return ""


def gate() -> tuple[bool, str]:
    """Whether hooks may be registered in this process, and why (the log line's text)."""
    if disabled():
        return False, "disabled by SGLANG_AMD_MOE_DISABLE=1"
    if on_rocm():
        platform = "ROCm torch"
    elif forced():
        platform = "SGLANG_AMD_MOE_FORCE=1"
    else:
        return False, "not ROCm (torch.version.hip is unset; SGLANG_AMD_MOE_FORCE=1 forces it)"
    problem = triton_problem()
    return (False, problem) if problem else (True, platform)
