"""Which of SGLang's paths pass ``_post_process_topk_ids`` a count of real rows, what each
path's padded rows hold, and what masks them here: SGLang itself (a fixed or patched
upstream, or its own zeroing of DP pad rows), the SGLang hook (only beyond a count), the
count-free guard at aiter's MoE entry (only where SGLang's MoE calls aiter's
``fused_moe``), or nothing. Padded rows that are valid forward passes need nothing.

The facts per path come from the installed SGLang's own files (:mod:`.paths`); a loose
``topk.py`` (``--sglang-source``) gets the rows of the releases whose body it has, from
the table generated from every release's wheel (``coverage.json``).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from sglang_amd_moe.diagnostics import patching
from sglang_amd_moe.diagnostics.audit import paths, plugins
from sglang_amd_moe.diagnostics.audit.read import AITER, SGLANG, TargetReport
from sglang_amd_moe.runtime.aiter import reach
from sglang_amd_moe.runtime.sglang import ledger

PATHS = paths.PATHS
TABLE = Path(__file__).with_name("coverage.json")
CELLS = {"yes": "count", "yes (EP)": "EP", "no": "none", "-": "-", "?": "?"}
NOTHING_NEEDED = "nothing needed (valid forward passes)"
ZEROED = "SGLang (pad rows zeroed before the gather)"
_TOPK_PARTS = ("srt", "layers", "moe", "topk.py")
_FALSE = ("false", "0")  # SGLang's get_bool_env_var reads these as off, any case
MORI_SET = (
    "SGLANG_MORI_NO_PAD_MASK is set here: SGLang leaves the padded weights of "
    "expert-parallel rows unzeroed (their ids are still 0)"
)


@functools.cache
def table() -> dict[str, dict]:
    """The committed table: release -> record (empty where the file is missing)."""
    try:
        doc = json.loads(TABLE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {rec["release"]: rec for rec in doc.get("releases", [])}


def _facts(row: dict) -> tuple:
    return tuple(row[k] for k in ("path", "family", "count", "rows", "upstream", "flag"))


def rows_of_body(source: str, file: str) -> tuple[list[dict] | None, str]:
    """The table's rows for the releases whose body ``source`` (a loose topk.py) is, by the
    ledger's record of where each fingerprint came from (a shipped patch's result too)."""
    reading = ledger.read(source, modules=file)
    if reading.known is None:
        return None, "this body is not in the ledger, so its release (and its paths) is not known"
    releases = sorted({s.split()[1] for s in reading.known.sources if s.startswith("sglang ")})
    recs = [table().get(r) for r in releases]
    if not releases or any(r is None for r in recs):
        missing = [r for r, rec in zip(releases, recs, strict=True) if rec is None]
        return None, f"no coverage rows for {', '.join(missing) or 'its release'} in this package"
    if len({tuple(map(_facts, rec["rows"])) for rec in recs}) > 1:  # type: ignore[index]
        return None, f"its body is that of {', '.join(releases)}, whose paths differ"
    what = "patched " if any("+" in s for s in reading.known.sources) else ""
    why = f"as SGLang {', '.join(releases)} (this {what}body's releases, by the ledger) pass them"
    return [dict(r) for r in recs[0]["rows"]], why  # type: ignore[index]


def _every_release(why: str) -> tuple[list[dict], str]:
    """For a body whose release is not known: each path as every release in the table has
    it where they all agree (the count and what the rows hold), else ``?`` with ``why``."""
    recs = list(table().values())
    out = []
    for p in PATHS:
        cells = {(r["count"], r["rows"]) for rec in recs for r in rec["rows"] if r["path"] == p}
        if len(cells) == 1 and recs:
            count, held = next(iter(cells))
            same = "as in every release of the table"
            out.append(paths.Row(p, paths.ALL, count, same, held, same))
        else:
            out.append(paths.Row(p, paths.ALL, "?", why, "?", why))
    span = f"{recs[0]['release']} - {recs[-1]['release']}" if recs else "none"
    return [r.to_json() for r in out], f"not known ({why}); as every release {span} has it"


def _installed_rows(file: Path) -> tuple[list[dict] | None, str]:
    top = file.parents[3] if file.parts[-4:] == _TOPK_PARTS else None
    if top is None or not (top / "srt/model_executor/forward_batch_info.py").is_file():
        return None, ""
    rows = [r.to_json() for r in paths.rows(paths.dir_tree(top))]
    return rows, "read from this SGLang's files"


def _env_off(row: dict) -> str:
    """The environment variable that turns SGLang's own DP zeroing off, when it is off."""
    name = row["flag"].split("=", 1)[0] if row["flag"] else ""
    value = os.environ.get(name, "") if name else ""
    return f"{name}={value}" if value.strip().lower() in _FALSE else ""


def _masker(sglang: TargetReport) -> str | None:
    """What masks the padded rows of a path that passes a count (None: nothing)."""
    state = {"not ROCm": "on a ROCm machine"}
    if sglang.patch_status == patching.ALREADY_APPLIED:
        return f"SGLang, patched ({sglang.patch})"
    if sglang.form == "fixed" and not sglang.needs_attention:
        return "SGLang (fixed upstream)"
    if sglang.covered:
        return f"the SGLang hook ({state.get(sglang.hook, sglang.hook)})"
    return None


def _guard(
    sglang: TargetReport, aiter: TargetReport | None, seen_from_here: bool
) -> tuple[str, str, reach.Reach]:
    """(who the guard is in ``protected_by``, "" where it masks nothing here; what the
    coverage lines say of it; whether SGLang's MoE reaches it). The guard counts only
    where it is installed and on, and where SGLang's MoE calls aiter's fused_moe."""
    guard = aiter.guard if aiter is not None else None
    file = Path(sglang.file or "")
    sglang_dir = file.parents[3] if file.parts[-4:] == _TOPK_PARTS else None
    aiter_dir = Path(aiter.file).parent if aiter and aiter.installed and aiter.file else None
    if seen_from_here:
        found = reach.bypasses(sglang_dir, aiter_dir) if aiter_dir is not None else ()
        moe = reach.sglang_moe(None, None, aiter_installed=aiter_dir is not None, paths=found)
    else:
        moe = reach.Reach(None, "cannot be seen from here (a --*-source file)")
    if guard is not None:
        why = guard["why"] if guard["covered"] else f"{guard['state']}: {guard['why']}"
    elif not seen_from_here:
        why = "cannot be seen from here"
    else:
        has = plugins.has_guard()
        why = "off: aiter is not installed here" if has else "not in this sglang-amd-moe"
    if guard is None or not guard["covered"]:
        return "", why, moe
    if moe.reaches is False:  # the guard's own log line may say so already
        return (
            "",
            why if "SGLang's MoE does not reach" in why else f"{why}; but {moe.describe()}",
            moe,
        )
    state = {"not ROCm": "on a ROCm machine"}.get(guard["state"], guard["state"])
    return f"the guard ({state})", why, moe


def _protected_by(row: dict, masker: str | None, guard_by: str) -> list[str]:
    count, held = row["count"], row["rows"]
    if count == "-":
        return ["-"]  # no such path in this release
    if held == paths.VALID and count == "no":
        return [NOTHING_NEEDED]
    if held == paths.ZEROED and not _env_off(row):
        return [ZEROED]
    if count == "yes (EP)":  # a count only with expert parallelism: on TP, none
        by = [f"{masker} with expert parallelism"] if masker else []
        return by + [guard_by or "on TP: NOTHING"]
    by = [masker] if count == "yes" and masker else []
    return by + ([guard_by] if guard_by else [])


def attach(reports: list[TargetReport], seen_from_here: bool) -> None:
    """Set the SGLang report's ``coverage`` (an empty ``protected_by``: nothing masks)."""
    sglang = next((r for r in reports if r.target == SGLANG and r.installed), None)
    aiter = next((r for r in reports if r.target == AITER), None)
    if sglang is None or sglang.form == "absent":
        return
    rows, source = _installed_rows(Path(sglang.file or ""))
    if rows is None:
        rows, source = rows_of_body(sglang.source, str(sglang.file))
    if rows is None:
        rows, source = _every_release(source)
    masker = _masker(sglang)
    guard_by, guard_why, moe = _guard(sglang, aiter, seen_from_here)
    mori = os.environ.get("SGLANG_MORI_NO_PAD_MASK", "").strip().lower() in ("true", "1")
    out, notes = [], []
    for row in rows:
        if row["path"] == "ep" and mori and row["flag"]:
            notes.append(MORI_SET)
        if row["rows"] == paths.ZEROED and _env_off(row):
            notes.append(f"{_env_off(row)} here: SGLang does not zero DP pad rows")
        out.append({
            "path": row["path"], "label": PATHS[row["path"]], "family": row["family"],
            "count": row["count"], "rows": row["rows"],
            "protected_by": _protected_by(row, masker, guard_by),
            "flag": row["flag"], "stale": row["stale"], "why": row["count_why"],
            "rows_why": row["rows_why"], "evidence": row["evidence"],
        })  # fmt: skip
    unprotected = [_name(p) for p in out if not p["protected_by"]]
    unprotected += [f"{_name(p)} on TP" for p in out if "on TP: NOTHING" in p["protected_by"]]
    sglang.coverage = dict(source=source, guard=guard_why, reach=moe.to_json(), paths=out,
                           unprotected=unprotected, notes=list(dict.fromkeys(notes)))  # fmt: skip


def _name(p: dict) -> str:
    fam = "" if p["family"] == paths.ALL else f" [{paths.FAMILIES[p['family']][0]}]"
    return f"{p['label']}{fam}"


def lines(cov: dict, pad: str) -> list[str]:
    out = [f"{pad}coverage ({cov['source']}; the count-free guard: {cov['guard']}):"]
    r = cov.get("reach") or {}
    if r.get("bypasses"):
        out.append(f"{pad}  aiter MoE calls the guard never sees: {'; '.join(r['bypasses'])}")
    for p in cov["paths"]:
        by = ", ".join(p["protected_by"]) or "NOTHING masks its padded rows"
        what = f"{CELLS.get(p['count'], p['count']):<5}  {p['rows']:<34}"
        out.append(f"{pad}  {_name(p)[:60]:<60}  {what}  {by}")
        if p["stale"]:
            out.append(f"{pad}    stale count: {p['stale']}")
    out.extend(f"{pad}  note: {n}" for n in cov.get("notes", []))
    return out
