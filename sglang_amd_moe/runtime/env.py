"""Environment switches (all ``SGLANG_AMD_MOE_*``, read at call time) and the one gate both
hooks sit behind.

The gate (:func:`gate`), asked once per process by the entry points, opens only when
``SGLANG_AMD_MOE_DISABLE`` is not set, torch is a ROCm build (``torch.version.hip``) or
``SGLANG_AMD_MOE_FORCE=1``, and the installed Triton (the ``triton`` module: ROCm torch
brings it as ``pytorch-triton-rocm``, CUDA torch as ``triton``) is at least
:data:`MIN_TRITON` (the sort kernel uses ``tl.gather``, new in Triton 3.3). Neither torch
nor Triton is imported to decide: where they are not imported yet, their versions are read
from their files (importing torch takes seconds).
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
_TRUE = {"1", "true", "yes", "on"}

#: The oldest Triton the kernels run on: the sort uses ``tl.gather`` (Triton 3.3).
MIN_TRITON: tuple[int, int] = (3, 3)
# Distributions that install the module `triton` (read when its file names no version).
_TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton-rocm", "pytorch-triton", "triton-rocm")
_VERSION_ASSIGNMENT = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.M)
_HIP_ASSIGNMENT = re.compile(r"^hip\s*(?::[^=\n]*)?=\s*(.+?)\s*$", re.M)


def flag(name: str) -> bool:
    """True when ``SGLANG_AMD_MOE_<name>`` is set to 1/true/yes/on (case-insensitive)."""
    return os.environ.get(PREFIX + name, "").strip().lower() in _TRUE


def disabled() -> bool:
    """``SGLANG_AMD_MOE_DISABLE=1``: the plugin registers nothing."""
    return flag("DISABLE")


def forced() -> bool:
    """``SGLANG_AMD_MOE_FORCE=1``: register the hooks even when torch is not a ROCm build."""
    return flag("FORCE")


def guard_off() -> bool:
    """``SGLANG_AMD_MOE_GUARD=0`` (0/false/no/off): the guard at aiter's MoE entry stays off."""
    return os.environ.get(PREFIX + "GUARD", "").strip().lower() in {"0", "false", "no", "off"}


def verify() -> bool:
    """``SGLANG_AMD_MOE_VERIFY=1``: check padded rows after every hooked call (a host sync)."""
    return flag("VERIFY")


def strict() -> bool:
    """``SGLANG_AMD_MOE_STRICT=1``: hook only code the plugin knows (released or patched
    forms); anything else is left to upstream."""
    return flag("STRICT")


def _origin(package: str) -> Path | None:
    """``package/__init__.py`` of an importable top-level package, without importing it
    (None: none, a namespace package, or one blocked with ``sys.modules[name] = None``)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin in (None, "namespace"):
        return None
    return Path(spec.origin)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def on_rocm() -> bool:
    """True when the installed torch is a ROCm build (``torch.version.hip``)."""
    if "torch" not in sys.modules:
        origin = _origin("torch")
        text = _read(origin.with_name("version.py")) if origin is not None else None
        match = _HIP_ASSIGNMENT.search(text or "")
        if origin is None or match:
            try:
                return bool(origin and ast.literal_eval(match.group(1)))
            except (ValueError, SyntaxError):
                pass  # not a literal: ask torch itself
    try:
        import torch
    except Exception:  # no torch: certainly not a ROCm SGLang process
        return False
    return bool(getattr(torch.version, "hip", None))


def triton_version() -> str | None:
    """The version of the importable ``triton`` module, without importing it.

    None: no ``triton`` module (or one blocked with ``sys.modules["triton"] = None``).
    "": a ``triton`` module whose version cannot be read.
    """
    if "triton" in sys.modules:
        mod = sys.modules["triton"]
        if mod is None:
            return None
        version = getattr(mod, "__version__", None)
        return version if isinstance(version, str) else ""
    origin = _origin("triton")
    if origin is None:
        return None
    match = _VERSION_ASSIGNMENT.search(_read(origin) or "")
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
    """Why the installed Triton (or ``version``) cannot run this package's kernels ("" when
    it can)."""
    if version is None:
        version = triton_version()
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
    """Whether hooks may be registered in this process, and why (the text the log line
    uses): ``SGLANG_AMD_MOE_DISABLE`` first, then the rule of the module docstring."""
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
