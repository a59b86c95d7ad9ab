"""Whether this process's SGLang MoE reaches aiter's ``fused_moe`` at all, read from the
environment and the command line only (nothing of SGLang or aiter is imported or run), and
the paths that reach aiter's MoE kernels without passing the guard at its entry.

SGLang calls aiter's ``fused_moe`` only on HIP, and only where its MoE runner is aiter's:
``--moe-runner-backend aiter``, or ``auto`` (the default) with ``SGLANG_USE_AITER=1``
(``SGLANG_INT4_WEIGHT=1`` picks it for FP8 too), where the quantization method has an
aiter path (an unquantized layer whose shape aiter's CK MoE does not take falls back to
Triton). With any other runner backend, or ``auto`` without those variables, SGLang's MoE
runs Triton's ``fused_moe`` and the guard never sees a call.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_TRUE = ("true", "1")  # SGLang's get_bool_env_var: a case-insensitive "true" or "1"
#: Files whose presence means a path that calls aiter's MoE kernels past the guard.
SGLANG_BYPASSES = {
    "srt/layers/moe/mega_moe_flydsl.py": "FlyDSL MegaMoEV2 (SGLang's MegaMoE on aiter's FlyDSL)",
    "srt/layers/moe/fused_moe_triton/aiter_mxfp4_w4a8_moe.py": (
        "the Triton W4A8 routing (aiter's triton moe_gemm_a8w4, MXFP4 W4A8)"
    ),
}
AITER_BYPASSES = {
    "fhmoe": "aiter's FHMoE: fused_moe sends calls with shared_* arguments to aiter.fhmoe"
}


@dataclass(frozen=True)
class Reach:
    reaches: bool | None  # None: cannot be told from here
    why: str
    bypasses: tuple[str, ...] = ()

    def describe(self) -> str:
        """One clause for a log line or the audit."""
        said = {True: "reaches it", False: "does not reach it", None: "may reach it"}
        text = f"SGLang's MoE {said[self.reaches]} ({self.why})"
        if self.bypasses:
            text += f"; not guarded: {'; '.join(self.bypasses)}"
        return text

    def to_json(self) -> dict:
        return {"reaches": self.reaches, "why": self.why, "bypasses": list(self.bypasses)}


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "false").strip().lower() in _TRUE


def runner_backend(argv: Sequence[str]) -> str:
    """``--moe-runner-backend`` from a server's command line ("auto" when absent; an
    ``Engine`` given its backend in code, not on the command line, reads as "auto")."""
    for i, arg in enumerate(argv):
        if arg == "--moe-runner-backend" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--moe-runner-backend="):
            return arg.split("=", 1)[1]
    return "auto"


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)  # a top-level name: found, never imported
    except (ImportError, ValueError):
        return None
    locs = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locs[0]) if locs else None


def bypasses(sglang_dir: Path | None = None, aiter_dir: Path | None = None) -> tuple[str, ...]:
    """The paths, present in the installed SGLang and aiter, that run aiter's MoE kernels
    without passing ``_fused_moe_impl`` (so without the guard)."""
    sglang_dir = sglang_dir if sglang_dir is not None else _package_dir("sglang")
    aiter_dir = aiter_dir if aiter_dir is not None else _package_dir("aiter")
    out = []
    if sglang_dir is not None:
        out += [what for rel, what in SGLANG_BYPASSES.items() if (sglang_dir / rel).is_file()]
    if aiter_dir is not None:
        for mod, what in AITER_BYPASSES.items():
            if (aiter_dir / f"{mod}.py").is_file() or (aiter_dir / mod).is_dir():
                out.append(what)
    return tuple(out)


def sglang_moe(
    environ: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
    *,
    aiter_installed: bool | None = None,
    paths: tuple[str, ...] | None = None,
) -> Reach:
    """Whether SGLang's MoE calls aiter's ``fused_moe`` in a process with ``environ`` and
    command line ``argv`` (None: not a server's, the backend is not known here)."""
    environ = os.environ if environ is None else environ
    found = bypasses() if paths is None else paths
    if aiter_installed is None:
        aiter_installed = _package_dir("aiter") is not None
    if not aiter_installed:
        return Reach(False, "aiter is not installed", found)
    backend = runner_backend(argv) if argv is not None else None
    use = [v for v in ("SGLANG_USE_AITER", "SGLANG_INT4_WEIGHT") if _flag(environ, v)]
    if backend == "aiter":
        return Reach(True, "--moe-runner-backend aiter", found)
    if backend not in (None, "auto"):
        why = f"--moe-runner-backend {backend}: SGLang's MoE runs {backend}, not aiter's fused_moe"
        return Reach(False, why, found)
    said = "--moe-runner-backend auto" if _given(argv) else "no --moe-runner-backend (auto)"
    if use:
        why = f"{'=1, '.join(use)}=1"
        why += f" and {said}" if backend else " with the auto MoE runner"
        why += ": aiter's fused_moe where the quantization method has an aiter path"
        later = "; a server given another --moe-runner-backend does not reach it"
        return Reach(True, why if backend else why + later, found)
    why = "SGLANG_USE_AITER is not set"
    why += f" and {said}" if backend else ""
    why += ": the auto MoE runner uses Triton's fused_moe, never aiter's"
    later = "; a server given --moe-runner-backend aiter reaches it"
    return Reach(False, why if backend else why + later, found)


def _given(argv: Sequence[str] | None) -> bool:
    return any(a == "--moe-runner-backend" or a.startswith("--moe-runner-backend=")
               for a in argv or ())  # fmt: skip


def this_process() -> str:
    """The clause for the guard's log line in this process ("" where SGLang is not loaded,
    as in vLLM, or where reading fails: a log line never fails the hook)."""
    if "sglang" not in sys.modules:
        return ""
    try:
        return sglang_moe(os.environ, sys.argv).describe()
    except Exception:  # noqa: BLE001 - a log line must not take the guard down
        return ""
