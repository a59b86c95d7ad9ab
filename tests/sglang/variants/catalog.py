"""The variants (see :mod:`variants`). Bases: the real topk.py of SGLang 0.5.12.post1
(no HIP handling), 0.5.13.post1 (weights only), 0.5.14 with upstream PR 28378 reversed
(mask under the EPLB guard; ``fixed14`` re-applies the fix to it: 0.5.14 as released,
modulo comments) and 0.5.23 (fixed, with the mask folded into the shared-expert append)."""

from __future__ import annotations

from collections.abc import Callable

from variants import DoesNotApply, Expect, Variant, edit, function_span, indent

NOHIP, WEIGHTS, GUARD, V23 = BASE_RELEASES = (
    "0.5.12.post1",
    "0.5.13.post1",
    "0.5.14-mask-under-eplb-guard",
    "0.5.23",
)

# --------------------------------------------------------------------- 0.5.14 pieces

GUARD_HIP = """    elif _is_hip:
        # The logical->physical remap is only meaningful when a real
        # expert-location mapping exists. With a trivial placement and EPLB off
        # the map is identity so the remap can be skipped safely.
        if _eplb_remap_enabled():
            # On AMD HIP the aiter MoE kernels do not handle topk_ids=-1 safely;
            # fill the padded region with 0 before the remap reads it.
            _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)
            topk_ids = topk_ids_logical_to_physical(
                topk_ids, expert_location_dispatch_info
            )
        # On AMD HIP the aiter MoE kernels do not handle topk_ids=-1 safely, so
        # padded tokens are neutralized by zeroing their routing weights.
        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)
"""

FIXED_HIP = """    elif _is_hip:
        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)
        if _eplb_remap_enabled():
            topk_ids = topk_ids_logical_to_physical(
                topk_ids, expert_location_dispatch_info
            )
        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)
"""

CUDA_START = "    recorder_topk_ids = None\n    if _is_cuda:\n"
TAIL_14 = "    if _is_hip:\n        # Shared-expert append/remap can introduce"


def fixed14(text: str) -> str:
    """0.5.14's HIP branch (the mask outside the EPLB guard), on the guard release."""
    return edit(text, GUARD_HIP, FIXED_HIP)


def hip14(body: str) -> Callable[[str], dict[str, str]]:
    """A variant of 0.5.14 whose HIP branch is ``body`` (indented for the elif)."""

    def build(text: str) -> dict[str, str]:
        return {"topk.py": edit(text, GUARD_HIP, "    elif _is_hip:\n" + body)}

    return build


def on_fixed14(change: Callable[[str], str]) -> Callable[[str], dict[str, str]]:
    def build(text: str) -> dict[str, str]:
        return {"topk.py": change(fixed14(text))}

    return build


def on(change: Callable[[str], str]) -> Callable[[str], dict[str, str]]:
    def build(text: str) -> dict[str, str]:
        return {"topk.py": change(text)}

    return build


# ------------------------------------------------------------------- the edits


def hip_not_first(text: str) -> str:
    return edit(
        text,
        CUDA_START,
        "    recorder_topk_ids = None\n"
        "    if _is_hip and topk_ids.dtype != torch.int32:\n"
        "        topk_ids = topk_ids.to(torch.int32)\n"
        "    if _is_cuda:\n",
    )


HELPER = '''
def _hip_padded_rows(topk_ids, topk_weights, num_token_non_padded, expert_location_dispatch_info):
    """HIP: padded ids to 0 before the gated remap, padded weights to 0."""
    _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)
    if _eplb_remap_enabled():
        topk_ids = topk_ids_logical_to_physical(topk_ids, expert_location_dispatch_info)
    _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)
    return topk_ids


def _post_process_topk_ids('''


def body_in_helper(text: str) -> str:
    text = edit(
        fixed14(text),
        FIXED_HIP,
        "    elif _is_hip:\n        topk_ids = _hip_padded_rows(\n"
        "            topk_ids, topk_weights, num_token_non_padded, expert_location_dispatch_info\n"
        "        )\n",
    )
    return edit(text, "\ndef _post_process_topk_ids(", HELPER)


def is_hip_call(text: str) -> str:
    text = edit(
        fixed14(text),
        "    elif _is_hip:\n        _mask_topk",
        "    elif is_hip():\n        _mask_topk",
    )
    return edit(text, TAIL_14, TAIL_14.replace("if _is_hip:", "if is_hip():"))


def hip_first(text: str) -> str:
    text = edit(fixed14(text), FIXED_HIP, "")
    hip_body = FIXED_HIP.replace("    elif _is_hip:\n", "")
    return edit(
        text,
        CUDA_START,
        "    recorder_topk_ids = None\n    if _is_hip:\n" + hip_body + "    elif _is_cuda:\n",
    )


def mask_inline(text: str) -> str:
    return edit(
        fixed14(text),
        "    elif _is_hip:\n"
        "        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)\n",
        "    elif _is_hip:\n"
        "        if num_token_non_padded is not None:\n"
        "            _rows = torch.arange(topk_ids.shape[0], device=topk_ids.device)\n"
        "            topk_ids[_rows >= num_token_non_padded, :] = 0\n",
    )


def fill_one(text: str) -> str:
    return edit(
        fixed14(text),
        "num_token_non_padded, fill_value=0)\n        if _eplb",
        "num_token_non_padded, fill_value=1)\n        if _eplb",
    )


def def_in_try(text: str) -> str:
    start, end = function_span(text)
    body = text[start:end].rstrip("\n") + "\n"
    wrapped = (
        "try:\n"
        + indent(body)
        + "except NameError:  # an optional dependency missing\n    raise\n\n\n"
    )
    return text[:start] + wrapped + text[end:]


def mask_helper_cuda_only(text: str) -> str:
    return edit(
        fixed14(text),
        "    fill_value: int = -1,\n) -> None:\n    if num_token_non_padded is None:\n"
        "        return\n",
        "    fill_value: int = -1,\n) -> None:\n"
        "    if num_token_non_padded is None or not _is_cuda:\n        return\n",
    )


def remap_unconditional(text: str) -> str:
    return edit(
        fixed14(text),
        "        if _eplb_remap_enabled():\n            topk_ids = topk_ids_logical_to_physical(\n"
        "                topk_ids, expert_location_dispatch_info\n            )\n",
        "        topk_ids = topk_ids_logical_to_physical(\n"
        "            topk_ids, expert_location_dispatch_info\n        )\n",
    )


def inverted_guard(text: str) -> str:
    return edit(
        fixed14(text),
        "        if _eplb_remap_enabled():\n            topk_ids = topk",
        "        if not _eplb_remap_enabled():\n            topk_ids = topk",
    )


REMAP_THEN_MASK = """        if _eplb_remap_enabled():
            topk_ids = topk_ids_logical_to_physical(
                topk_ids, expert_location_dispatch_info
            )
        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)
        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)
"""

DOUBLE_REMAP = """        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)
        if _eplb_remap_enabled():
            topk_ids = topk_ids_logical_to_physical(topk_ids, expert_location_dispatch_info)
        if _eplb_remap_enabled():
            topk_ids = topk_ids_logical_to_physical(topk_ids, expert_location_dispatch_info)
        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)
"""

GUARD_CLAUSE = """        if not _eplb_remap_enabled():
            _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)
            return topk_ids, topk_weights, topk_ids
        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)
        topk_ids = topk_ids_logical_to_physical(topk_ids, expert_location_dispatch_info)
        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)
"""


def count_renamed(text: str) -> str:
    start, end = function_span(text)
    fn = text[start:end]
    if fn.count("num_token_non_padded") < 3:
        raise DoesNotApply("no num_token_non_padded to rename")
    return text[:start] + fn.replace("num_token_non_padded", "num_real_rows") + text[end:]


def predicate_renamed(text: str) -> str:
    if text.count("_eplb_remap_enabled") < 2:
        raise DoesNotApply("no _eplb_remap_enabled")
    return text.replace("_eplb_remap_enabled", "_expert_remap_active")


def predicate_annotated(text: str) -> str:
    return edit(
        text,
        "        if _eplb_remap_enabled():\n            # On AMD HIP",
        "        remap_on: bool = _eplb_remap_enabled()\n        if remap_on:\n"
        "            # On AMD HIP",
    )


INLINED = """        from sglang.srt.server_args import get_global_server_args as _server_args

        try:
            _sa = _server_args()
        except ValueError:
            _sa = None
        if _sa is not None and (
            _sa.enable_eplb
            or _sa.init_expert_location != "trivial"
            or _sa.ep_num_redundant_experts > 0
        ):
            # On AMD HIP"""


def predicate_inlined(text: str) -> str:
    return edit(text, "        if _eplb_remap_enabled():\n            # On AMD HIP", INLINED)


def as_staticmethod(text: str) -> str:
    start, end = function_span(text)
    body = text[start:end].rstrip("\n") + "\n"
    cls = (
        "class _TopkPostProcess:\n    @staticmethod\n"
        + indent(body)
        + "\n\n_post_process_topk_ids = _TopkPostProcess._post_process_topk_ids\n\n\n"
    )
    return text[:start] + cls + text[end:]


def as_alias(text: str) -> str:
    start, end = function_span(text)
    body = text[start:end].replace(
        "def _post_process_topk_ids(", "def _post_process_topk_ids_impl(", 1
    )
    body = body.rstrip("\n") + "\n\n\n_post_process_topk_ids = _post_process_topk_ids_impl\n\n\n"
    return text[:start] + body + text[end:]


IMPL = "topk_impl_variant"


def imported_definition(text: str) -> dict[str, str]:
    start, end = function_span(text)
    stub = f"from sglang.srt.layers.moe.{IMPL} import _post_process_topk_ids  # noqa: E402\n\n\n"
    return {"topk.py": text[:start] + stub + text[end:], f"{IMPL}.py": text}


def hip_flag_renamed(text: str) -> str:
    if "_on_rocm" in text or text.count("_is_hip") < 2:
        raise DoesNotApply("cannot rename _is_hip")
    return text.replace("_is_hip", "_on_rocm")


def override_under_if(text: str) -> str:
    """0.5.14 fixed, and a module-level override (bound on HIP) with the weights-only
    body: a HIP process runs the override."""
    text = fixed14(text)
    start, end = function_span(text)
    fn = text[start:end]
    override = fn.replace("def _post_process_topk_ids(", "def _post_process_topk_ids_hip(", 1)
    override = edit(
        override,
        FIXED_HIP,
        "    elif _is_hip:\n"
        "        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)\n",
    )
    tail = (
        "\n\n# The test machine is not HIP: make the override bind at import as a HIP one does.\n"
        "_VARIANT_IMPORTED_AS_HIP = True\n"
        "if _is_hip or _VARIANT_IMPORTED_AS_HIP:\n"
        "    _post_process_topk_ids = _post_process_topk_ids_hip\n"
    )
    return text + "\n\n" + override.rstrip("\n") + "\n" + tail


# 0.5.23 pieces
HIP_23 = (
    "    elif _is_hip:\n        # On AMD HIP the aiter MoE kernels do not handle topk_ids=-1 safely"
)
GFX95_23 = "_is_gfx95 = is_gfx95_supported()\n"
TAIL_ZERO_23 = """        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)

    return topk_ids, topk_weights, recorder_topk_ids"""


def not_gfx95(text: str, mi355: bool) -> str:
    text = edit(text, HIP_23, HIP_23.replace("elif _is_hip:", "elif _is_hip and not _is_gfx95:"))
    if mi355:
        text = edit(text, GFX95_23, "_is_gfx95 = True  # as on an MI355 (gfx950)\n")
    return text


def weights_not_zeroed(text: str) -> str:
    return edit(
        text,
        TAIL_ZERO_23,
        TAIL_ZERO_23.replace("_zero_topk_weights_padded_region(", "pass  # (", 1),
    )


def default_fill(text: str) -> str:
    old = (
        "            _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)\n"
        "        if ("
    )
    return edit(text, old, old.replace(", fill_value=0)", ")"))


#: One line appended to 0.5.23's topk.py that turns its padded-row mask into a no-op, and
#: the same by ``setattr`` on the module (not a statement binding the name: the ledger's
#: reading itself must refuse it). Each must read ``unknown``, never ``fixed``; more ways
#: to rebind are read (not run) in ``test_ledger_helpers.py``.
MASK_OFF = {
    "mask-off-appended": "_mask_topk_ids_padded_region = lambda *a, **k: None",
    "mask-off-setattr": (
        "import sys\n"
        "setattr(sys.modules[__name__], '_mask_topk_ids_padded_region', lambda *a, **k: None)"
    ),
}


def appended(line: str) -> Callable[[str], str]:
    def change(text: str) -> str:
        return text + "\n" + line + "\n"

    return change


def systemexit_on_import(text: str) -> str:
    return text + "\n\nraise SystemExit(3)  # a module that refuses to import here\n"


# ------------------------------------------------------------------- the catalog

RIGHT = {"bare_right": True}

VARIANTS: list[Variant] = [
    # Correct functions written differently: bodies no release has (the ledger does not
    # know them), which the plugin must run and leave alone.
    Variant(
        "fixed14",
        GUARD,
        "0.5.14's HIP branch (PR 28378 applied)",
        on(fixed14),
        Expect("fixed", "fixed", "not-needed", **RIGHT),
    ),
    Variant(
        "hip-branch-not-first",
        GUARD,
        "an unrelated `if _is_hip and ...` before the CUDA/HIP branches",
        on_fixed14(hip_not_first),
        Expect("unknown", "fixed", "not-needed", **RIGHT),
    ),
    Variant(
        "hip-body-in-helper",
        GUARD,
        "the HIP branch's body moved into a module helper",
        on(body_in_helper),
        Expect("unknown", "fixed", "not-needed", **RIGHT),
    ),
    Variant(
        "is-hip-call",
        GUARD,
        "`elif is_hip():` instead of the module flag",
        on(is_hip_call),
        Expect("unknown", "fixed", "not-needed", **RIGHT),
    ),
    Variant(
        "hip-first",
        GUARD,
        "the HIP branch first, CUDA in the elif",
        on(hip_first),
        Expect("unknown", "fixed", "not-needed", **RIGHT),
    ),
    Variant(
        "mask-inline",
        GUARD,
        "the padded-id fill written inline (an element store) instead of the helper",
        on(mask_inline),
        Expect("unknown", "fixed", "not-needed", **RIGHT),
    ),
    Variant(
        "fill-one",
        GUARD,
        "padded ids filled with 1 (in range): the source reads odd, the behaviour is right",
        on(fill_one),
        Expect("unknown", "fixed", "not-needed", **RIGHT),
    ),
    Variant(
        "def-in-try",
        GUARD,
        "the fixed def inside a module-level try:",
        on_fixed14(def_in_try),
        Expect("unknown", "fixed", "not-needed", **RIGHT),
    ),
    Variant(
        "count-renamed",
        GUARD,
        "num_token_non_padded renamed: the plugin cannot find the count and refuses; "
        "upstream is right",
        on_fixed14(count_renamed),
        Expect("unknown", None, "refused", **RIGHT),
        count_param="num_real_rows",
    ),
    # The bug written differently.
    Variant(
        "mask-helper-cuda-only",
        GUARD,
        "the fixed branch, but the mask helper fills only on CUDA",
        on(mask_helper_cuda_only),
        Expect("unknown", "unknown", "live", "upstream"),
    ),
    Variant(
        "guard-clause-return",
        GUARD,
        "`if not eplb: zero; return` before the mask",
        hip14(GUARD_CLAUSE),
        Expect("unknown", "mask-under-eplb-guard", "live", "upstream"),
    ),
    Variant(
        "predicate-renamed",
        GUARD,
        "the EPLB predicate renamed (upstream renamed it once already)",
        on(predicate_renamed),
        Expect("unknown", "mask-under-eplb-guard", "live", "upstream"),
    ),
    Variant(
        "predicate-annotated",
        GUARD,
        "the predicate bound by an annotated assignment",
        on(predicate_annotated),
        Expect("unknown", "mask-under-eplb-guard", "live", "upstream"),
    ),
    Variant(
        "predicate-inlined",
        GUARD,
        "the predicate's server-args reads inlined, through a local import (the source cannot "
        "tell that args exist whenever EPLB is on: unknown, never fixed)",
        on(predicate_inlined),
        Expect("unknown", "mask-under-eplb-guard", "live", "upstream"),
    ),
    Variant(
        "override-under-if",
        GUARD,
        "a weights-only override bound under a module-level `if _is_hip ...:`",
        on(override_under_if),
        Expect("unknown", "weights-only", "live", "add"),
    ),
    Variant(
        "mi355-not-gfx95",
        V23,
        "`elif _is_hip and not _is_gfx95:` on an MI355: HIP falls to the generic branch "
        "(-1 fill, remap whatever EPLB says)",
        on(lambda t: not_gfx95(t, mi355=True)),
        Expect("unknown", "unknown", "live", "own", post_mask=True),
    ),
    Variant(
        "mi300-not-gfx95",
        V23,
        "the same on an MI300 (gfx942): the HIP branch runs; the source cannot tell which GPU",
        on(lambda t: not_gfx95(t, mi355=False)),
        Expect("unknown", "fixed", "not-needed", **RIGHT),
    ),
    # Upstream's own remap is what is wrong: the plugin owns it.
    Variant(
        "remap-unconditional",
        GUARD,
        "HIP remaps whatever EPLB says",
        on(remap_unconditional),
        Expect("unknown", "unknown", "live", "own"),
    ),
    Variant(
        "inverted-guard",
        GUARD,
        "`if not eplb: remap`",
        on(inverted_guard),
        Expect("unknown", "unknown", "live", "own"),
    ),
    Variant(
        "double-remap",
        GUARD,
        "the remap twice under the guard",
        hip14(DOUBLE_REMAP),
        Expect("unknown", "unknown", "live", "own"),
    ),
    Variant(
        "remap-before-mask",
        GUARD,
        "the gated remap before the fill: the remap reads garbage ids",
        hip14(REMAP_THEN_MASK),
        Expect("unknown", "unknown", "live", "upstream"),
    ),
    Variant(
        "default-fill",
        V23,
        "0.5.23 filling padded ids with -1 (the helper's default) on HIP",
        on(default_fill),
        Expect("unknown", "unknown", "live", "own", post_mask=True),
    ),
    Variant(
        "weights-not-zeroed",
        V23,
        "0.5.23 without its trailing padded-weight zeroing",
        on(weights_not_zeroed),
        Expect("unknown", "unknown", "live", "upstream"),
    ),
    # A helper the body calls, rebound after its definition.
    *(
        Variant(
            name,
            V23,
            f"0.5.23 with `{line.splitlines()[-1]}` appended: padded ids never masked",
            on(appended(line)),
            Expect("unknown", "unknown", "live", "upstream"),
        )
        for name, line in MASK_OFF.items()
    ),
    # Functions that are not a top-level def.
    Variant(
        "staticmethod",
        GUARD,
        "the guard form as a class's static method, bound by an alias",
        on(as_staticmethod),
        Expect("unknown", "mask-under-eplb-guard", "live", "upstream"),
    ),
    Variant(
        "alias",
        WEIGHTS,
        "the weights-only form defined under another name, bound by an alias",
        on(as_alias),
        Expect("unknown", "weights-only", "live", "add"),
    ),
    Variant(
        "imported-definition",
        GUARD,
        "the guard form defined in another module and imported",
        imported_definition,
        Expect("unknown", "mask-under-eplb-guard", "live", "upstream"),
    ),
    Variant(
        "def-in-try-broken",
        NOHIP,
        "the no-hip-handling form inside a module-level try:",
        on(def_in_try),
        Expect("unknown", "no-hip-handling", "live", "add"),
    ),
    # The module around it.
    Variant(
        "hip-flag-renamed",
        WEIGHTS,
        "the module's _is_hip renamed: the hook must act on the new name",
        on(hip_flag_renamed),
        Expect("unknown", "weights-only", "live", "add"),
        hip_flags=("_on_rocm",),
    ),
    Variant(
        "hip-flag-renamed-guard",
        GUARD,
        "the same on the guard form",
        on(hip_flag_renamed),
        Expect("unknown", "mask-under-eplb-guard", "live", "upstream"),
        hip_flags=("_on_rocm",),
    ),
    Variant(
        "systemexit-on-import",
        WEIGHTS,
        "topk.py raises SystemExit while importing: register() must not raise",
        on(systemexit_on_import),
        Expect("weights-only", None, "pending", import_fails=True),
    ),
    # The releases themselves, and register() from four threads at once.
    Variant(
        "no-hip-handling",
        NOHIP,
        "0.5.12.post1 as released",
        on(lambda t: t),
        Expect("no-hip-handling", "no-hip-handling", "live", "add"),
    ),
    Variant(
        "weights-only",
        WEIGHTS,
        "0.5.13.post1 as released",
        on(lambda t: t),
        Expect("weights-only", "weights-only", "live", "add"),
    ),
    Variant(
        "mask-under-eplb-guard",
        GUARD,
        "0.5.14 with PR 28378 reversed",
        on(lambda t: t),
        Expect("mask-under-eplb-guard", "mask-under-eplb-guard", "live", "upstream"),
    ),
    Variant(
        "fixed23",
        V23,
        "0.5.23 as released",
        on(lambda t: t),
        Expect("fixed", "fixed", "not-needed", **RIGHT),
    ),
    Variant(
        "threads-weights-only",
        WEIGHTS,
        "register() from four threads at once: one wrap, one remap",
        on(lambda t: t),
        Expect("weights-only", "weights-only", "live", "add"),
        load="threads",
    ),
    Variant(
        "threads-guard",
        GUARD,
        "the same on the guard form",
        on(lambda t: t),
        Expect("mask-under-eplb-guard", "mask-under-eplb-guard", "live", "upstream"),
        load="threads",
    ),
]

BY_NAME = {v.name: v for v in VARIANTS}
assert len(BY_NAME) == len(VARIANTS), "variant names must be unique"
