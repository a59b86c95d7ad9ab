"""Which of SGLang's paths pass ``_post_process_topk_ids`` a count of real rows, and what
masks each path's padded rows: the SGLang hook (or a fixed or patched upstream) acts only
beyond a count; the count-free guard at aiter's MoE entry acts on every call."""

from __future__ import annotations

from pathlib import Path

from sglang_amd_moe.diagnostics import patching, sources
from sglang_amd_moe.diagnostics.audit import plugins
from sglang_amd_moe.diagnostics.audit.read import AITER, BROKEN_FORMS, SGLANG, TargetReport

PATHS = {"ep": "expert parallel, all-to-all (DeepEP, mori)", "tp": "TP MoE (forward_normal)"}
PATHS |= {"dp": "DP attention with TP MoE", "draft": "EAGLE/MTP draft graphs"}
CELLS = {"yes": "count", "no": "none", "zeroed": "none", "?": "?"}  # "zeroed": SGLang's own
ZEROED = "SGLang (pad rows zeroed before the gather; SGLANG_DP_MASK_PAD_ROWS)"
_EP_ONLY = {"ep": "yes", "tp": "no", "dp": "no", "draft": "no"}


def attach(reports: list[TargetReport], seen_from_here: bool) -> None:
    """Set the SGLang report's ``coverage`` (an empty ``protected_by``: nothing masks)."""
    sglang = next((r for r in reports if r.target == SGLANG and r.installed), None)
    guard = next((r.guard for r in reports if r.target == AITER), None)
    if sglang is None or sglang.form == "absent":
        return
    file = Path(sglang.file or "")
    top = file.parents[3] if file.parts[-4:] == ("srt", "layers", "moe", "topk.py") else None
    count = sources.sglang_counts(top) if top is not None else None
    source = "read from this SGLang's forward_batch_info.py and EAGLE draft graph runners"
    if count is None and sglang.form in BROKEN_FORMS:
        count, source = dict(_EP_ONLY), f"as every release of form {sglang.form} passes them"
    elif count is None:
        count, source = dict.fromkeys(PATHS, "?"), "not known: this SGLang's code does not say"
    state = {"not ROCm": "on a ROCm machine"}
    masker = None  # of a path that passes a count
    if sglang.patch_status == patching.ALREADY_APPLIED:
        masker = f"SGLang, patched ({sglang.patch})"
    elif sglang.form == "fixed" and not sglang.needs_attention:
        masker = "SGLang (fixed upstream)"
    elif sglang.covered:
        masker = f"the SGLang hook ({state.get(sglang.hook, sglang.hook)})"
    if guard is not None:
        guard_why = guard["why"] if guard["covered"] else f"{guard['state']}: {guard['why']}"
    elif not seen_from_here:
        guard_why = "cannot be seen from here"
    else:
        has = plugins.has_guard()
        guard_why = "off: aiter is not installed here" if has else "not in this sglang-amd-moe"
    covered = guard is not None and guard["covered"]
    guard_by = f"the guard ({state.get(guard['state'], guard['state'])})" if covered else ""
    paths = []
    for key, label in PATHS.items():
        by = [masker] if count[key] == "yes" and masker else []
        by += [ZEROED] * (count[key] == "zeroed") + [guard_by] * bool(guard_by)
        paths.append({"path": label, "count": count[key], "protected_by": by})
    unprotected = [p["path"] for p in paths if not p["protected_by"]]
    sglang.coverage = dict(source=source, guard=guard_why, paths=paths, unprotected=unprotected)


def lines(cov: dict, pad: str) -> list[str]:
    out = [f"{pad}coverage ({cov['source']}; the count-free guard: {cov['guard']}):"]
    for p in cov["paths"]:
        by = ", ".join(p["protected_by"]) or "NOTHING masks its padded rows"
        out.append(f"{pad}  {p['path']:<42}  {CELLS[p['count']]:<5}  {by}")
    return out
