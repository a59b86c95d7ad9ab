"""Environment switches shared by the hooks (all prefixed ``SGLANG_AMD_MOE_``).

Read at call time, not import time, so a test or a launcher can set them after this
package was imported.
"""

from __future__ import annotations

import os

PREFIX = "SGLANG_AMD_MOE_"
_TRUE = {"1", "true", "yes", "on"}


def flag(name: str) -> bool:
    """True when ``SGLANG_AMD_MOE_<name>`` is set to 1/true/yes/on (case-insensitive)."""
    return os.environ.get(PREFIX + name, "").strip().lower() in _TRUE


def disabled() -> bool:
    """``SGLANG_AMD_MOE_DISABLE=1``: the plugin registers nothing."""
    return flag("DISABLE")


def forced() -> bool:
    """``SGLANG_AMD_MOE_FORCE=1``: register the hooks even when torch is not a ROCm build."""
    return flag("FORCE")


def verify() -> bool:
    """``SGLANG_AMD_MOE_VERIFY=1``: check padded rows after every hooked call (a host sync)."""
    return flag("VERIFY")


def on_rocm() -> bool:
    """True when the installed torch is a ROCm build (``torch.version.hip``)."""
    try:
        import torch
    except Exception:  # no torch: certainly not a ROCm SGLang process
        return False
    return bool(getattr(torch.version, "hip", None))


def platform_reason() -> tuple[bool, str]:
    """Whether hooks may be registered on this platform, and why (for the INFO line)."""
    if on_rocm():
        return True, "ROCm torch"
    if forced():
        return True, "SGLANG_AMD_MOE_FORCE=1"
    return False, "not ROCm (torch.version.hip is unset; SGLANG_AMD_MOE_FORCE=1 forces it)"
