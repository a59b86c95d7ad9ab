"""The SGLang plugin against real SGLang releases (one driver run per release and mode).

What is asserted, per release (the form comes from ``releases.py``; ``test_ledger.py``
checks the ledger says the same of the installed source):

* without the plugin, the HIP branch lets the garbage of padded rows through exactly as
  its form says (ids out of range / -1, NaN weights), and with EPLB on the broken
  released forms do not remap at all;
* after the real ``load_plugins()`` with this package's real entry point, padded rows
  come out as id 0 (the remapped id of expert 0 with EPLB on) with weight +0.0, and
  real rows are bit-identical to a call without padding;
* with EPLB on, real rows are remapped exactly once (the placement is a rotation, so a
  second remap would show); with it off they are not remapped even with a
  non-trivial dispatch info passed;
* after aiter's shared-expert append padded rows still have zero weights and ids in
  range;
* loading again changes nothing and logs no second summary line; a broken upstream
  logs and does not raise; ``SGLANG_AMD_MOE_VERIFY=1`` passes on good output and names
  the layer on bad output.
"""

from __future__ import annotations

import pytest
import sglang_release_support
from driver import DriverResult
from sglang_release_support import ENV_VAR, release_group, releases, selected_releases

from sglang_amd_moe.runtime.sglang import ledger
from sglang_amd_moe.runtime.sglang.names import ACTIONS
from sglang_amd_moe.runtime.target import logged

N_REAL, E, K = 5, 16, 4
BROKEN = ("no-hip-handling", "weights-only", "mask-under-eplb-guard")
SUMMARY = "sglang-amd-moe: sglang "


def _form(release) -> str:
    return release.expected_form


def _pad(rows: list) -> list:
    return rows[N_REAL:]


def _summary_lines(data: DriverResult) -> list[dict]:
    return [
        r for r in data["logs"] if r["logger"] == "sglang_amd_moe" and r["msg"].startswith(SUMMARY)
    ]


def _needs_topk(release, driven) -> None:
    """A release whose topk cannot be imported here is only acceptable without a plugin
    loader (0.5.10); then the behaviour tests skip and say why."""
    for mode in ("bare", "plugin"):
        err = driven[mode].get("topk_import_error")
        if err:
            if release.has_plugin_loader:
                pytest.fail(f"{release.label}: sglang.srt.layers.moe.topk does not import: {err}")
            pytest.skip(
                f"{release.label}: sglang.srt.layers.moe.topk does not import "
                f"on this machine ({err})"
            )


def test_unpatched_release_passes_garbage_per_form(release, driven) -> None:
    _needs_topk(release, driven)
    bare, form = driven["bare"], _form(release)
    assert not bare["is_live"] and not bare["function_is_wrapped"]
    off = bare["scenarios"]["off_noargs"]
    real = bare["real_ids"]
    assert off["ids"][:N_REAL] == real
    if form == "fixed":
        assert _pad(off["ids"]) == [[0] * K] * 3
        assert _pad(off["w_bits"]) == [[0] * K] * 3
    else:
        # The garbage comes out: 9999, -1, 16, 123456, ... exactly as the router left it.
        assert _pad(off["ids"]) == bare["pad_ids"]
        if form == "no-hip-handling":
            assert _pad(off["w"]) == [["nan"] * K] * 3
        else:
            assert _pad(off["w_bits"]) == [[0] * K] * 3
    on = bare["scenarios"]["on"]
    remapped = [[bare["perm"][e] for e in row] for row in real]
    if form in ("fixed", "mask-under-eplb-guard"):
        assert on["ids"][:N_REAL] == remapped
        assert _pad(on["ids"]) == [[bare["perm"][0]] * K] * 3
    else:
        # Upstream defect on HIP: no logical-to-physical remap at all.
        assert on["ids"][:N_REAL] == real
        assert _pad(on["ids"]) == bare["pad_ids"]


def test_plugin_hooks_exactly_the_broken_forms(release, driven) -> None:
    plugin, form = driven["plugin"], _form(release)
    assert plugin["load_plugins_1_raised"] is None
    lines = _summary_lines(plugin)
    # A broken form is decided when topk is imported: one line at load, one at the import.
    imported = not plugin.get("topk_import_error")
    assert len(lines) == (2 if form in BROKEN and imported else 1), lines
    if not imported and not release.has_plugin_loader:
        # register() called directly (no loader): topk is not imported, so the hook waits
        # for its import, which then fails in SGLang itself: nothing is ever hooked.
        assert plugin["loader"].startswith("sglang_amd_moe.runtime.plugin.register")
        assert lines[0]["msg"].endswith(logged("when sglang.srt.layers.moe.topk is imported"))
        assert plugin["status"]["state"] == "pending"
        return
    _needs_topk(release, driven)
    if release.has_plugin_loader:
        assert plugin["loader"] == "sglang.srt.plugins.load_plugins"
    else:  # register() called directly, and topk imported after it
        assert "applied when sglang.srt.layers.moe.topk was imported" in lines[-1]["msg"]
    if release.has_plugin_loader:
        applied = [
            r
            for r in plugin["logs"]
            if r["msg"].startswith("Applied 1 hook(s) to sglang.srt.layers.moe.topk")
        ]
        assert applied == []  # the hook wraps the function itself at topk's import
    assert plugin["is_live"] is (form in BROKEN)
    assert plugin["function_is_wrapped"] is (form in BROKEN)
    assert all(line["level"] == "INFO" for line in lines)
    assert f"_post_process_topk_ids form={form} -> " in lines[-1]["msg"]
    expected_action = ACTIONS[form]
    assert f"form={form} -> {expected_action}" in lines[-1]["msg"]


def test_plugin_masks_padded_rows_and_keeps_real_rows_bit_identical(release, driven) -> None:
    _needs_topk(release, driven)
    plugin = driven["plugin"]
    # With the topk module's _is_hip false the call is upstream's, bit for bit.
    assert plugin["not_hip_identical"] is True
    for name in ("off_noargs", "off_info"):
        padded, unpadded = plugin["scenarios"][name], plugin["scenarios"][f"{name}_unpadded"]
        assert _pad(padded["ids"]) == [[0] * K] * 3, name
        assert _pad(padded["w_bits"]) == [[0] * K] * 3, name  # +0.0, not NaN, not -0.0
        assert padded["ids"][:N_REAL] == unpadded["ids"], name
        assert padded["w_bits"][:N_REAL] == unpadded["w_bits"], name
        assert padded["ids"][:N_REAL] == plugin["real_ids"], name  # EPLB off: never remapped


def test_eplb_remap_happens_exactly_once(release, driven) -> None:
    _needs_topk(release, driven)
    plugin = driven["plugin"]
    assert plugin["remap_enabled_off"] is False
    assert plugin["remap_enabled_on"] is True
    perm = plugin["perm"]
    assert plugin["eplb_info_map"] == perm  # the real init_new read our placement
    assert all(perm[e] != e and perm[perm[e]] != perm[e] for e in range(E))  # twice != once
    on, on_unpadded = plugin["scenarios"]["on"], plugin["scenarios"]["on_unpadded"]
    once = [[perm[e] for e in row] for row in plugin["real_ids"]]
    assert on["ids"][:N_REAL] == once
    assert on_unpadded["ids"] == once
    assert on["w_bits"][:N_REAL] == on_unpadded["w_bits"]
    # Padded rows: filled with logical expert 0, then remapped like every row.
    assert _pad(on["ids"]) == [[perm[0]] * K] * 3
    assert _pad(on["w_bits"]) == [[0] * K] * 3


def test_shared_expert_append_keeps_padded_rows_clean(release, driven) -> None:
    _needs_topk(release, driven)
    bare, plugin = driven["bare"], driven["plugin"]
    for data in (bare, plugin):
        if "error" in data["append"]:
            failed = data["append"]
            pytest.fail(
                f"aiter shared-expert append path failed: {failed['error']}\n{failed['tb']}"
            )
    out = plugin["append"]
    assert [len(r) for r in out["ids"]] == [K + 1] * 8  # the shared column was appended
    for row_ids, row_w in zip(_pad(out["ids"]), _pad(out["w"]), strict=True):
        assert all(0 <= e < E + 1 for e in row_ids), row_ids
        assert row_w == [0.0] * (K + 1), row_w
    # Real rows are what upstream alone produces.
    assert out["ids"][:N_REAL] == bare["append"]["ids"][:N_REAL]
    assert out["w"][:N_REAL] == bare["append"]["w"][:N_REAL]
    if _form(release) == "no-hip-handling":
        # Upstream alone leaves the appended shared weight live in padded rows.
        assert any(w != 0.0 for row in _pad(bare["append"]["w"]) for w in row)


def test_loading_twice_changes_nothing(release, driven) -> None:
    _needs_topk(release, driven)
    plugin, form = driven["plugin"], _form(release)
    for key in ("load_plugins_2_raised", "load_plugins_3_raised", "register_again_raised"):
        assert plugin.get(key) is None, (key, plugin.get(key))
    if release.has_plugin_loader:
        assert "load_plugins_3_raised" in plugin  # the plugin really ran a second time
    assert plugin["same_function_after_reload"] is True
    assert plugin["is_live_after_reload"] is (form in BROKEN)
    assert plugin["off_noargs_after_reload"]["ids"] == plugin["scenarios"]["off_noargs"]["ids"]
    assert (
        plugin["off_noargs_after_reload"]["w_bits"] == plugin["scenarios"]["off_noargs"]["w_bits"]
    )
    assert len(_summary_lines(plugin)) == (2 if form in BROKEN else 1)
    assert plugin["status"]["hooked"] is (form in BROKEN)
    assert plugin["status"]["state"] == ("live" if form in BROKEN else "not-needed")


def test_broken_upstream_logs_and_does_not_raise(release, driven) -> None:
    _needs_topk(release, driven)
    bare, form = driven["bare"], _form(release)
    assert bare["broken_load_raised"] is None
    assert bare["broken_is_live"] is False
    status = bare["broken_status"]
    assert status["hooked"] is False
    # topk was imported, so the running module decides (not the file, whose form is `form`).
    assert status["form"] == "absent"
    warned = [
        r
        for r in bare["logs"]
        if r["level"] == "WARNING" and "no callable _post_process_topk_ids" in r["msg"]
    ]
    assert len(warned) == 1
    assert f"has form {form}" in warned[0]["msg"]


def test_verify_mode_on_top_of_another_plugins_hook(release, driven) -> None:
    _needs_topk(release, driven)
    bare, form = driven["bare"], _form(release)
    assert bare["verify_register_raised"] is None
    assert bare["verify_status"]["hooked"] is True
    assert "SGLANG_AMD_MOE_VERIFY=1" in bare["verify_status"]["message"]
    assert bare["verify_is_live"] is True
    assert bare["verify_call_raised"] is None
    assert _pad(bare["verify_call"]["ids"]) == [[0] * K] * 3
    assert _pad(bare["verify_call"]["w_bits"]) == [[0] * K] * 3
    if release.has_plugin_loader:
        # Another plugin's AROUND hook was applied first; ours wraps it and it still runs.
        assert bare["observer_applied"] is True
        assert "wrapped on top of it directly" in bare["verify_status"]["message"]
        assert bare["observer_calls"] == 1
    if "verify_skip_mask_raised" in bare:
        # Upstream told to skip its own padded-weight zeroing: VERIFY names the layer.
        assert bare["verify_skip_mask_raised"] is not None
        assert "layer 3" in bare["verify_skip_mask_raised"]
    elif form == "fixed":
        pytest.skip(f"{release.label} has no _skip_hip_pad_mask switch to make upstream misbehave")


@release_group(releases.MAIN_RELEASE)
def test_unknown_form_gets_the_guard_and_a_warning_with_its_hash(tmp_path_factory) -> None:
    """The newest release's own function with its padded-weight zeroing removed (no
    release looks like that): the plugin applies only its pre-mask and warns, naming the
    file and the function's sha256. (A phase of the release's bare driver run.)"""
    rel = releases.BY_LABEL[releases.MAIN_RELEASE]
    rels, _ = selected_releases()
    if rel not in rels:
        pytest.skip(f"{rel.label} not selected by {ENV_VAR}")
    data = sglang_release_support.driven(rel, tmp_path_factory)["bare"]["unknown"]
    assert data["errors"] == [], data["errors"]
    # First, SGLANG_PLUGINS naming another plugin: SGLang skipped ours, nothing installed.
    assert data["whitelist_load_raised"] is None
    assert data["whitelist_status"] is None
    assert any(
        r["msg"] == "Skipping plugin sglang_amd_moe (not in SGLANG_PLUGINS)" for r in data["logs"]
    )
    assert data["tail_zero_found"] == 1, (
        "the release's trailing weight zeroing moved: update TAIL_ZERO"
    )
    # Without the guard this function leaves NaN weights in padded rows.
    assert _pad(data["bare"]["w"]) == [["nan"] * K] * 3
    assert data["register_raised"] is None
    assert data["is_live"] is True
    report = ledger.read(open(data["unknown_file"]).read(), modules=rel.topk_path())
    assert report.form == "unknown"
    assert data["status"]["form"] == "unknown" and data["status"]["hooked"] is True
    lines = _summary_lines(data)
    assert len(lines) == 1 and lines[0]["level"] == "WARNING"
    assert data["unknown_file"] in lines[0]["msg"]
    assert f"sha256 {report.fingerprint}" in lines[0]["msg"]
    assert f"line {report.lineno}" in lines[0]["msg"]
    hooked, unpadded = data["hooked"], data["hooked_unpadded"]
    assert _pad(hooked["ids"]) == [[0] * K] * 3
    assert _pad(hooked["w_bits"]) == [[0] * K] * 3
    assert hooked["ids"][:N_REAL] == unpadded["ids"]
    assert hooked["w_bits"][:N_REAL] == unpadded["w_bits"]
