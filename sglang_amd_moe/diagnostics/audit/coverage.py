"""Which of SGLang's paths pass ``_post_process_topk_ids`` the count of real rows, and what
masks each path's padded rows: the SGLang hook (or a fixed or patched upstream) acts only
beyond a count; the count-free guard at aiter's MoE entry acts on every call.

The counts are read from the installed SGLang where its code has a shape known here
(``enable_num_token_non_padded()``, which decides whether a CUDA graph passes one, and
the EAGLE draft graph runners, which set none); else, for the forms the plugin hooks, from
what every release of that form does (docs/reference.md); else they are not known."""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from pathlib import Path

from sglang_amd_moe.diagnostics import patching
from sglang_amd_moe.diagnostics.audit.read import BROKEN_FORMS, GUARD, SGLANG, TargetReport
from sglang_amd_moe.diagnostics.sources import text_or_none

PATHS = {"ep": "expert parallel, all-to-all (DeepEP, mori)", "tp": "TP MoE (forward_normal)"}
PATHS |= {"dp": "DP attention with TP MoE", "draft": "EAGLE/MTP draft graphs"}
CELLS = {"yes": "count", "no": "none", "zeroed": "none", "?": "?"}  # "zeroed": SGLang's own
ZEROED = "SGLang (pad rows zeroed before the gather; SGLANG_DP_MASK_PAD_ROWS)"
_EP_ONLY = {"ep": "yes", "tp": "no", "dp": "no", "draft": "no"}
_FBI = "srt/model_executor/forward_batch_info.py"
_DRAFTS = [f"srt/speculative/eagle_draft{x}_cuda_graph_runner.py" for x in ("", "_extend")]


def read_counts(root: Path) -> dict[str, str] | None:
    """The counts as the SGLang package at ``root`` passes them (None: not read)."""
    try:
        defs = {getattr(n, "name", ""): n for n in ast.parse(text_or_none(root / _FBI) or "").body}
    except SyntaxError:
        return None
    fn = defs.get("enable_num_token_non_padded")
    if not isinstance(fn, ast.FunctionDef):
        return None
    called = [defs.get(getattr(c, "id", "")) for c in ast.walk(fn)]  # helpers it calls, too
    code = " ".join(ast.unparse(f) for f in (fn, *called) if isinstance(f, ast.FunctionDef))
    body = [ast.unparse(s) for s in fn.body if not isinstance(s, ast.Expr)]
    if "SGLANG_DP_MASK_PAD_ROWS" in code:  # on HIP, on by default (0.5.23)
        on = os.environ.get("SGLANG_DP_MASK_PAD_ROWS", "true").lower() in ("true", "1")
        dp = "zeroed" if on else "no"
    elif len(body) == 1 and re.fullmatch(r"return \S*(ep_size|expert_parallel)\S* > 1", body[0]):
        dp = "no"  # `expert-parallel size > 1` and nothing else (0.5.10 - 0.5.14)
    else:
        return None
    texts = [t for t in (text_or_none(root / d) for d in _DRAFTS) if t]
    try:
        tokens = [t for x in texts for t in tokenize.generate_tokens(io.StringIO(x).readline)]
    except (tokenize.TokenError, SyntaxError):
        texts, tokens = [], []
    sets_one = any(t.string == "num_token_non_padded" for t in tokens if t.type == tokenize.NAME)
    draft = "no" if texts and not sets_one else "?"
    return {"ep": "yes", "tp": "no", "dp": dp, "draft": draft}


def attach(reports: list[TargetReport], seen_from_here: bool) -> None:
    """Set the SGLang report's ``coverage``: per path, whether a count reaches the function
    and what masks its padded rows (an empty ``protected_by``: nothing)."""
    sglang = next((r for r in reports if r.target == SGLANG and r.installed), None)
    guard = next((r for r in reports if r.target == GUARD), None)
    if sglang is None or sglang.form == "absent":
        return
    file = Path(sglang.file or "")
    top = file.parents[3] if file.parts[-4:] == ("srt", "layers", "moe", "topk.py") else None
    count = read_counts(top) if top is not None else None
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
    guard_by = f"the guard ({state.get(guard.hook, guard.hook)})" if guard and guard.covered else ""
    guard_why = "not in this sglang-amd-moe" if seen_from_here else "cannot be seen from here"
    guard_why = (guard.reason if guard.covered else f"off: {guard.reason}") if guard else guard_why
    paths = []
    for key, label in PATHS.items():
        by = [masker] if count[key] == "yes" and masker else []
        by += [ZEROED] * (count[key] == "zeroed") + [guard_by] * bool(guard_by)
        paths.append({"path": label, "count": count[key], "protected_by": by})
    unprotected = [p["path"] for p in paths if not p["protected_by"]]
    sglang.coverage = dict(source=source, guard=guard_why, paths=paths, unprotected=unprotected)


def lines(cov: dict, pad: str) -> list[str]:
    """The coverage as the table's details print it."""
    out = [f"{pad}coverage ({cov['source']}; the count-free guard: {cov['guard']}):"]
    for p in cov["paths"]:
        by = ", ".join(p["protected_by"]) or "NOTHING masks its padded rows"
        out.append(f"{pad}  {p['path']:<42}  {CELLS[p['count']]:<5}  {by}")
    return out
