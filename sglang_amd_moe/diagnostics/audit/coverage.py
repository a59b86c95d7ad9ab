"""Which of SGLang's paths pass ``_post_process_topk_ids`` the count of real rows, and what
protects each path's padded rows: the SGLang hook (or a fixed or patched upstream) acts
only on rows beyond a count; the count-free guard at aiter's MoE entry acts on every call.

The counts are read from the installed SGLang where its code has a shape this module
knows (``enable_num_token_non_padded()``, which decides whether a CUDA graph passes a
count, and the EAGLE draft graph runners, which set none); else, for the forms the plugin
hooks, from what every release of that form does (docs/reference.md, "Which paths pass a
count"); else they are not known.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from pathlib import Path

from sglang_amd_moe.diagnostics import patching
from sglang_amd_moe.diagnostics.audit.read import BROKEN_FORMS, TargetReport, text_or_none

PATHS = {
    "ep": "expert parallel, all-to-all (DeepEP, mori)",
    "tp": "TP MoE (forward_normal)",
    "dp": "DP attention with TP MoE",
    "draft": "EAGLE/MTP draft graphs",
}
#: Count -> its cell: passed, none, none but SGLang zeroes the pad rows itself, not known.
CELLS = {"yes": "count", "no": "none", "zeroed": "none", "?": "?"}
ZEROED = "SGLang (pad rows zeroed before the gather; SGLANG_DP_MASK_PAD_ROWS)"
_EP_ONLY = {"ep": "yes", "tp": "no", "dp": "no", "draft": "no"}
_FBI = "srt/model_executor/forward_batch_info.py"
_DRAFTS = tuple(f"srt/speculative/eagle_draft{x}_cuda_graph_runner.py" for x in ("", "_extend"))


def _names(text: str) -> set[str]:
    """Names in ``text``'s code (comments left out); raises on a file that does not tokenize."""
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return {t.string for t in tokens if t.type == tokenize.NAME}


def read_counts(root: Path) -> dict[str, str] | None:
    """The counts as the SGLang package at ``root`` passes them (None: not read)."""
    try:
        tree = ast.parse(text_or_none(root / _FBI) or "")
    except SyntaxError:
        return None
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    fn = defs.get("enable_num_token_non_padded")
    if fn is None:
        return None
    calls = [
        c.func.id for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
    ]
    strings = {
        n.value
        for f in (fn, *(defs[c] for c in calls if c in defs))
        for n in ast.walk(f)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }
    body = [
        s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    test = body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) else None
    ep_only = isinstance(test, ast.Compare) and (
        re.search(r"ep_size|expert_parallel", ast.unparse(test.left))
        and ast.unparse(test).endswith(" > 1")
    )
    if "SGLANG_DP_MASK_PAD_ROWS" in strings:  # on HIP, by default (0.5.23)
        on = os.environ.get("SGLANG_DP_MASK_PAD_ROWS", "true").lower() in ("true", "1")
        dp = "zeroed" if on else "no"
    elif ep_only:  # `expert-parallel size > 1` and nothing else (0.5.10 - 0.5.14)
        dp = "no"
    else:
        return None
    try:
        drafts = [_names(t) for t in map(text_or_none, (root / d for d in _DRAFTS)) if t]
    except (tokenize.TokenError, SyntaxError):
        drafts = []
    sets_none = bool(drafts) and not any("num_token_non_padded" in n for n in drafts)
    return {"ep": "yes", "tp": "no", "dp": dp, "draft": "no" if sets_none else "?"}


def counts(sglang: TargetReport) -> tuple[dict[str, str], str]:
    """(path -> "yes" / "no" / "zeroed" / "?", where that comes from)."""
    file = Path(sglang.file or "")
    top = file.parents[3] if file.parts[-4:] == ("srt", "layers", "moe", "topk.py") else None
    found = read_counts(top) if top is not None else None
    if found is not None:
        return found, f"read from {top}/{_FBI} and the draft graph runners"
    if sglang.form in BROKEN_FORMS:
        return dict(_EP_ONLY), f"every release of form {sglang.form} (docs/reference.md)"
    return dict.fromkeys(PATHS, "?"), "not known: this SGLang's code does not say"


def _masker(sglang: TargetReport) -> str | None:
    """Who masks the padded rows of a path that passes a count."""
    if sglang.needs_attention and not sglang.covered:
        return None
    if sglang.patch_status == patching.ALREADY_APPLIED:
        return f"SGLang, patched ({sglang.patch})"
    if sglang.form == "fixed":
        return "SGLang (fixed upstream)"
    return f"the SGLang hook ({_state(sglang.hook)})" if sglang.covered else None


def _state(hook: str) -> str:
    return "on a ROCm machine" if hook == "not ROCm" else hook


def attach(sglang: TargetReport, guard: TargetReport | None, seen_from_here: bool) -> None:
    """Set ``sglang.coverage``: per path, whether a count reaches the function, and what
    masks its padded rows (nothing: an empty ``protected_by``)."""
    count, source = counts(sglang)
    if guard is not None and guard.covered:
        guard_by, guard_why = f"the guard ({_state(guard.hook)})", guard.reason
    elif guard is not None:
        guard_by, guard_why = None, f"off: {guard.reason}"
    else:
        guard_by = None
        guard_why = "not in this sglang-amd-moe" if seen_from_here else "cannot be seen from here"
    masker, paths = _masker(sglang), []
    for key, label in PATHS.items():
        by = [masker] if count[key] == "yes" and masker else []
        by += [ZEROED] if count[key] == "zeroed" else []
        paths.append(
            {"path": label, "count": count[key], "protected_by": by + [guard_by] * bool(guard_by)}
        )
    unprotected = [p["path"] for p in paths if not p["protected_by"]]
    sglang.coverage = {
        "source": source,
        "guard": guard_why,
        "paths": paths,
        "unprotected": unprotected,
    }


def lines(cov: dict, pad: str) -> list[str]:
    """The coverage as the table's details print it."""
    out = [f"{pad}coverage ({cov['source']}); the count-free guard: {cov['guard']}"]
    width = max(len(p) for p in PATHS.values())
    for p in cov["paths"]:
        by = ", ".join(p["protected_by"]) or "NOTHING masks its padded rows"
        out.append(f"{pad}  {p['path']:<{width}}  {CELLS[p['count']]:<5}  {by}")
    return out
