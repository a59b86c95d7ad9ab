"""The variant library (``variants/``) against real releases, through the real ``load_plugins()``.

One runner subprocess per base release runs all of that release's variants (importing
topk costs seconds once; each further variant re-imports only topk). For every variant
the ledger's answer (a released body's form, or ``unknown``), the probe's verdict, the
plugin's decision and the outcome with and without the plugin are recorded apart (the
table is written next to the results as ``variants.md``), then asserted against the
variant's expectation. With the plugin every variant must come out right: padded rows
with ids in range and weight 0, real rows exactly as a correct release returns them,
EPLB off and on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sglang_release_support import HERE, driver_env, releases, require_built, selected_releases
from variants import BASE_RELEASES, Variant, overlay
from variants.catalog import VARIANTS


def _selected() -> list[str]:
    rels, _ = selected_releases()
    return [r.label for r in rels if r.label in BASE_RELEASES]


def _group(label: str) -> pytest.MarkDecorator:
    """One base release's variants run in one runner: on one worker."""
    return pytest.mark.xdist_group(f"variants-{label}")


class VariantRuns:
    """The runners' records, one runner per base release, started when a test first
    asks for its base: alone on a worker of several (its other bases' tests may be on
    another), else every selected base at once, two at a time (a 2-core machine)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.records: dict[str, dict] = {}  # variant name -> record
        self.patch_checks: dict[str, list] = {}  # base label -> checks
        self.wall_s: dict[str, float] = {}

    def of(self, label: str) -> dict[str, dict]:
        """name -> record for ``label``'s variants, and ``__patch_checks__``."""
        if label not in self.patch_checks:
            alone = "PYTEST_XDIST_WORKER" in os.environ
            todo = [label] if alone else [lb for lb in _selected() if lb not in self.patch_checks]
            self._run(todo)
        mine = {n: r for n, r in self.records.items() if r.get("base") == label}
        return {**mine, "__patch_checks__": {label: self.patch_checks[label]}}

    def _run(self, labels: list[str]) -> None:
        procs = []
        for label in labels:
            rel = releases.BY_LABEL[label]
            if not rel.is_built():
                continue
            topk = rel.topk_path()
            ov = overlay.make(topk.parents[3], self.root / f"overlay-{label}")
            out = self.root / f"{label}.json"
            env = driver_env("plugin")
            # Plain CPU tensors: the package's mask runs its torch reference (the Triton
            # kernel itself is covered by test_releases.py and the kernel tests).
            env.pop("TRITON_INTERPRET", None)
            env["PYTHONPATH"] = str(ov)
            log = open(self.root / f"{label}.log", "w")  # noqa: SIM115 (closed below)
            cmd = [str(rel.python), "-m", "variants.runner", str(out), label, str(ov), str(topk)]
            proc = subprocess.Popen(
                cmd, cwd=str(HERE), env=env, stdout=log, stderr=subprocess.STDOUT
            )
            procs.append((label, out, log, proc, time.perf_counter()))
            if len(procs) % 2 == 0:  # two at a time: a 2-core machine
                procs[-2][3].wait(timeout=900)
        for label, out, log, proc, t0 in procs:
            rc = proc.wait(timeout=900)
            log.close()
            if rc != 0 or not out.exists():
                tail = (self.root / f"{label}.log").read_text(errors="replace")[-4000:]
                pytest.fail(f"variant runner for {label} exited {rc}:\n{tail}")
            doc = json.loads(out.read_text())
            for rec in doc["variants"]:
                self.records[rec["name"]] = rec
            self.patch_checks[label] = doc.get("patch_checks", [])
            self.wall_s[label] = round(time.perf_counter() - t0, 1)
        (self.root / "variants.md").write_text(table(self.records))
        print(f"\nvariant table: {self.root / 'variants.md'}", file=sys.stderr)


@pytest.fixture(scope="session")
def variant_runs(tmp_path_factory) -> VariantRuns:
    return VariantRuns(tmp_path_factory.mktemp("variants"))


def table(results: dict[str, dict]) -> str:
    """The results as a Markdown table: verdicts apart, then the action and outcome."""
    rows = [
        "| variant | base | ledger | probe | plugin | remap | without plugin | with plugin |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in VARIANTS:
        r = results.get(v.name)
        if r is None or "status" not in r:
            continue
        st = r["status"] or {}
        plan = r.get("plan") or {}
        remap = (plan.get("remap") or "-") + (" + post-mask" if plan.get("post_mask") else "")
        probe = (r.get("probe") or {}).get("behaviour") or "not run"
        rows.append(
            f"| {v.name} | {v.base} | {r['classifier']['form']} | {probe} | {st.get('state')} | "
            f"{remap} | {_outcome(r, 'bare')} | {_outcome(r, 'hooked')} |"
        )
    return "\n".join(rows) + "\n"


def _outcome(r: dict, key: str) -> str:
    o = r.get(key)
    if o is None:
        return "import fails" if r.get("import_error") else "-"
    return "right" if o["right"] else "wrong"


def _variant_params() -> list:
    return [pytest.param(v, id=v.name, marks=_group(v.base)) for v in VARIANTS]


@pytest.mark.parametrize("variant", _variant_params())
def test_variant(variant: Variant, variant_runs: VariantRuns) -> None:
    rel = releases.BY_LABEL[variant.base]
    if variant.base not in _selected():
        pytest.skip(
            f"{variant.base} not selected by {os.environ.get('SGLANG_AMD_MOE_TEST_RELEASES')}"
        )
    require_built(rel)
    r = variant_runs.of(variant.base)[variant.name]
    assert "error" not in r, r.get("error")
    assert "does_not_apply" not in r, (
        f"the edit no longer applies to {variant.base}: {r['does_not_apply']}"
    )
    exp = variant.expect
    # The two verdicts, apart.
    assert r["classifier"]["form"] == exp.classifier, r["classifier"]
    # The plugin: never raises, one line, the expected decision.
    assert r["load_raised"] is None
    st = r["status"]
    assert st is not None and st["state"] == exp.state, st
    # One line at load; a body not known as fixed is decided at topk's import: a second.
    deferred = exp.classifier != "fixed" and not exp.import_fails
    assert len(r["summary_lines"]) == (2 if deferred else 1), r["summary_lines"]
    if exp.import_fails:
        assert "import_error" in r
        assert st["message"].endswith("when sglang.srt.layers.moe.topk is imported")
        return
    assert r["probe"]["behaviour"] == (exp.probe or ""), r["probe"]
    # Each variant is a body of its own: a verdict is the ledger's or probed for it now.
    assert "verdict read from the cache" not in st["message"], st["message"]
    if r["plugin_probe"] is not None:
        assert "verdict probed now in a child process" in st["message"], st["message"]
    plan = r["plan"] or {}
    if exp.state in ("live", "pending"):
        assert plan.get("remap") == exp.remap, plan
        assert plan.get("post_mask", False) is exp.post_mask, plan
        assert r["our_layers_after"] == 1  # one wrap, whatever the threads
    else:
        assert r["our_layers_after"] == 0
    # What upstream alone does is what the variant claims (so the variant tests something).
    assert r["bare"]["right"] is exp.bare_right, r["bare"]["wrong"]
    # With the plugin: right, and the audit's view of this process (observe) says so.
    assert r["hooked"]["right"], r["hooked"]["wrong"]
    # (where the probe cannot run the function at all, it cannot say it is right)
    assert r["observe"] is not None and r["observe"]["correct"] is (exp.probe is not None)


@pytest.mark.parametrize("label", [pytest.param(lb, marks=_group(lb)) for lb in BASE_RELEASES])
def test_the_table_keeps_the_verdicts_apart(label: str, variant_runs: VariantRuns) -> None:
    """Each base release's rows: one per variant built on it."""
    if label not in _selected():
        pytest.skip(f"{label} not selected")
    require_built(releases.BY_LABEL[label])
    text = table(variant_runs.of(label))
    assert "| ledger | probe |" in text
    shown = [line for line in text.splitlines()[2:] if line.startswith("| ")]
    assert len(shown) == len([v for v in VARIANTS if v.base == label])


@pytest.mark.parametrize(
    "label",
    [
        pytest.param(lb, marks=_group(lb))
        for lb in ("0.5.12.post1", "0.5.13.post1", "0.5.14-mask-under-eplb-guard")
    ],
)
def test_a_patch_is_probed_before_it_is_offered(label: str, variant_runs: VariantRuns) -> None:
    """What the audit calls before it offers a patch (``topk_source.probe_source``), on
    the real release: the shipped patch makes the function right; the same patch with
    its added lines naming a parameter the function lacks still applies, and the probe
    catches it."""
    if label not in _selected():
        pytest.skip(f"{label} not selected")
    require_built(releases.BY_LABEL[label])
    checks = {c["case"]: c for c in variant_runs.of(label)["__patch_checks__"][label]}
    assert "error" not in checks, checks
    shipped, broken = checks["as shipped"], checks["names a missing parameter"]
    assert shipped["ran"] and shipped["correct"], shipped
    assert shipped["classifier"] == "fixed"  # the ledger knows the shipped patch's result
    assert broken["ran"] and not broken["correct"]
    assert broken["classifier"] == "unknown"
    assert any("NameError" in f for f in broken["findings"]), broken
