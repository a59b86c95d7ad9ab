"""The check's printed table: a header that says what ran, one line per (form, batch), and
footnotes that define every column."""

from __future__ import annotations

from sglang_amd_moe.diagnostics.e2e.results import CheckResult, Compare
from sglang_amd_moe.runtime.sglang.names import FUNCTION_NAME

SELECT_NOTE = "select_experts(custom_routing_function=the HIP router)"
#: The routing line when ``select_experts`` could not be used (``sglang_calls``).
DIRECT_NOTE = (
    "this release's select_experts asserts num_token_non_padded is None with a custom "
    "router, so the router's output goes straight into its _post_process_topk_ids"
)


def err_cell(cmp: Compare) -> str:
    """The max abs error, ``n/a`` where the real rows hold non-finite entries: the error
    over the finite ones (0, say) would read as "no damage" next to a row full of NaN."""
    x = cmp.max_abs_err
    return "n/a" if cmp.nan_count else "nan" if x != x else "0" if x == 0 else f"{x:.3g}"


def guard_cell(counts: dict[str, int]) -> str:
    """What the guard's counters say it changed in one row (all layers)."""
    return (
        f"guard: {counts.get('out_of_range', 0)} ids out of range -> expert 0, weight 0 "
        f"({counts.get('calls', 0)} calls)"
    )


def render(result: CheckResult) -> str:
    meta, c = result.meta, result.meta["config"]
    lines = [
        f"sglang-amd-moe check: tiny MoE, seed {c['seed']}: {c['layers']} MoE layers, "
        f"hidden {c['hidden']}, {c['routed_experts']} routed + {c['shared_experts']} shared "
        f"experts, top-{c['top_k']}, {c['n_group']} groups / top-{c['topk_group']} "
        f"(DeepSeek grouped router), fp32 on {meta['device']}",
        f"SGLang {result.sglang}: real select_experts/{FUNCTION_NAME}, topk module forced to "
        "_is_hip=True, _is_cuda=False",
        "padded rows: NaN rows and +-1e30 rows; NaN rows get stale-LDS ids from the HIP "
        "router (emulated)",
        f"routing: {DIRECT_NOTE if meta['direct'] else SELECT_NOTE}",
        "consumer: aiter-like, called as SGLang calls aiter fused_moe (no num_local_tokens)",
        "sorts that ran: " + meta["sorts"],
    ]
    for f in result.forms:
        lines.append(f"form {f.source}: {f.form}{f' ({f.note})' if f.note else ''}")
        if f.hook_message:
            lines.append(f"  plugin: hook live={f.hook_live}; {f.hook_message}")
    lines.append("")
    head = (
        f"{'SGLang form':<32} {'batch':>10} | {'WITHOUT plugin: max abs err':>27} {'NaN':>6} "
        f"{'bad rows':>9} {'out-of-range ids':>16} | WITH plugin vs unpadded run"
    )
    lines += [head, "-" * (len(head) + 24)]
    by_key = {(r.source, r.real, r.padded): r for r in result.with_}
    for r in result.without:
        label, batch = f"{r.source}: {r.form}", f"{r.real} of {r.padded}"
        if r.error:
            left = f"{'error: ' + r.error[:60]:>70}"
        else:
            cmp = r.compare
            left = f"{err_cell(cmp):>27} {cmp.nan_count:>6} {cmp.bad_rows:>5}/{r.real:<3} "
            left += f"{r.out_of_range_ids:>16}"
        w = by_key.get((r.source, r.real, r.padded))
        wc = w.compare if w is not None and not w.error else None
        right = "not run" if w is None else f"error: {w.error[:60]}" if wc is None else wc.match
        if wc is not None and wc.match == "within 1e-6":
            right += f" (max rel {wc.max_rel_err:.2g}; summation order differs)"
        elif wc is not None and wc.match == "MISMATCH":
            seen = f"NaN {wc.nan_count}, ids seen {w.out_of_range_ids}"
            right += f" (max abs {err_cell(wc)}, {seen})"
        if w is not None and w.guard:
            right += f"; {guard_cell(w.guard)}"
        lines.append(f"{label:<32} {batch:>10} | {left} | {right}")
    for f in result.forms:
        if not f.reachable:
            lines.append(f"{f.source + ': ' + f.form:<32} {'':>10} | not reachable here: {f.note}")
    lines.append("")
    if result.forms and result.forms[0].form == "fixed":
        lines.append(
            "installed form `fixed`: upstream already masks padded ids on HIP, so without the "
            "plugin it already matches; the bug shows on the rebuilt form here, and on the "
            "installed form in an older release's environment (e.g. "
            ".compat/0.5.13.post1/bin/python -m sglang_amd_moe check)"
        )
    lines += [
        "without plugin: real rows only; max abs err = largest |difference| from the unpadded "
        "run, n/a when some entries are non-finite (they are counted under NaN), NaN = "
        "non-finite entries, bad rows = rows not bit-identical, out-of-range ids = ids "
        "outside [0, NE) read by the consumer's sort (all layers)",
        "  out-of-range ids are sorted by an emulation of aiter's pre-fix HIP sort "
        "(e2e.amd_emulation.legacy_hip_sort): the device behaviour is undefined",
        "no-count rows: the batch carries no count (DP attention with TP MoE, EAGLE/MTP drafts, "
        "ATOM's DP pads, vLLM's -1 rows), so upstream and the plugin's SGLang hook cannot mask; "
        "the MoE goes through an aiter-shaped fused_moe entry, which the plugin's guard wraps "
        "as it wraps aiter's; the guard's counters say how many entries it changed",
        "with plugin: exact = bit-identical to the unpadded run; within 1e-6 = max|diff| <= "
        "1e-6 * max|ref|",
        f"result: {meta['verdict']}  ({meta['elapsed_s']:.1f} s)",
    ]
    return "\n".join(lines)
