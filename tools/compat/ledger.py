"""Regenerate the plugin's ledger of SGLang bodies from the real release wheels.

For every SGLang release on the registry that has ``_post_process_topk_ids``
(:data:`VERSIONS`), this reads ``topk.py`` out of the release's wheel (downloaded once into
``.cache/wheels``; nothing is installed), and for that text, each shipped patch's result
where the patch applies, and the never-released ``mask-under-eplb-guard`` body (upstream
PR 28378 reversed: ``sglang_amd_moe/diagnostics/e2e/guard_form/*.diff``, where one applies;
with the shipped patches on top), it

* fingerprints the function (``sglang_amd_moe.runtime.sglang.ledger``);
* runs it with the plugin's probe: its own module-level code (the function, the helpers
  and flags it uses, its ``TopKConfig``) is compiled over a copy of the installed main
  release's topk module, which supplies what it imports;
* names the form by that behaviour and the plan by the hook's own ``decide``.

It writes ``ledger.json`` (fingerprint -> form, plan, sources) and ``ledger_bodies.json``
(the normalised function of each, for the audit's diff) into the package. A body whose
behaviour no form names, or that the probe cannot run, stops the tool: look at it first.

Usage::

    python tools/compat/ledger.py write       # download what is missing, regenerate
    python tools/compat/ledger.py check       # exit 1 when the committed ledger differs
"""

from __future__ import annotations

import os

# On this CPU, Triton kernels a release's topk.py defines run in Triton's interpreter
# (read once, when triton is first imported).
os.environ.setdefault("TRITON_INTERPRET", "1")

import ast  # noqa: E402
import dataclasses  # noqa: E402
import importlib
import inspect
import json
import sys
import types
import warnings
import zipfile
from pathlib import Path
from typing import Any

import build_env  # a sibling module (tools/compat)

from sglang_amd_moe.diagnostics import patching, topk_source
from sglang_amd_moe.diagnostics.topk_source import function_from_source
from sglang_amd_moe.runtime.sglang import hook, ledger, names
from sglang_amd_moe.runtime.sglang.probe import probe
from sglang_amd_moe.runtime.target import Refusal

REPO = Path(__file__).resolve().parents[2]
#: Every release on the registry with the function (0.5.9 and earlier have none).
VERSIONS = (
    "0.5.10",
    "0.5.10.post1",
    "0.5.11",
    "0.5.12",
    "0.5.12.post1",
    "0.5.13",
    "0.5.13.post1",
    "0.5.14",
    "0.5.15",
    "0.5.15.post1",
    "0.5.16",
    "0.5.17",
    "0.5.18",
    "0.5.19",
    "0.5.20",
    "0.5.21",
    "0.5.22",
    "0.5.23",
)
#: Upstream PR 28378 reversed, per span of releases: the never-released guard form.
GUARD_DIFFS = tuple(sorted((REPO / "sglang_amd_moe/diagnostics/e2e/guard_form").glob("*.diff")))
TOPK_IN_WHEEL = "sglang/srt/layers/moe/topk.py"


def wheel_topk(version: str) -> str:
    """The release's ``topk.py``, read out of its wheel."""
    whl = build_env.fetch_wheel([sys.executable, "-m", "pip"], version)
    with zipfile.ZipFile(whl) as zf:
        return zf.read(TOPK_IN_WHEEL).decode()


def variants(label: str, text: str) -> list[tuple[str, str]]:
    """(source, text): the release, the guard body rebuilt from it, and every shipped
    patch applied to either where it applies."""
    bases = [(label, text)]
    for diff in GUARD_DIFFS:
        reverse = diff.read_text()
        if patching.status(text, reverse) == patching.APPLIES:
            bases.append((f"{label} + guard_form/{diff.name}", patching.apply_text(text, reverse)))
    out = list(bases)
    for base_label, base in bases:
        for name in patching.patch_names("sglang"):
            patch = patching.read_patch(name)
            if patching.status(base, patch) == patching.APPLIES:
                out.append((f"{base_label} + {name}", patching.apply_text(base, patch)))
    return out


def _live_topk() -> types.ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(names.TOPK_MODULE)


def _function(text: str, live: types.ModuleType) -> tuple[Any, dict[str, Any]]:
    """``text``'s function over a copy of the live module's globals in which its own
    function, helpers, flags and ``TopKConfig`` ran."""
    tree = ast.parse(text)
    binding, fn = ledger._binding(tree, text)
    if fn is None:
        raise LookupError(f"{names.FUNCTION_NAME}: {binding}")
    config = [s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == "TopKConfig"]
    stmts = {id(s): s for s in [fn, *ledger._used_statements(tree, fn), *config]}
    return function_from_source(live, text, sorted(stmts.values(), key=lambda s: s.lineno))


def entry_for(text: str, live: types.ModuleType) -> tuple[str, dict[str, Any]]:
    """(fingerprint, {form, plan}) of the function ``text`` defines, by running it."""
    reading = ledger.read(text)
    fn, ns = _function(text, live)
    observed = probe(fn, ns, hip_flags=reading.hip_flags, predicates=reading.predicates)
    if not observed.usable or observed.behaviour == "unknown":
        raise RuntimeError(f"the probe cannot name this body: {observed.summary()}")
    params = tuple(inspect.signature(fn).parameters)
    inputs = hook.Inputs(params, None, observed, reading.remaps_on_hip)
    plan = hook.decide(inputs)
    if isinstance(plan, Refusal) and plan.state != "not-needed":
        raise RuntimeError(f"the hook refuses this body: {plan.reason}")
    as_plan = None if isinstance(plan, Refusal) else dataclasses.asdict(plan)
    if as_plan is not None:
        as_plan.pop("verify")
    return reading.fingerprint, {"form": observed.behaviour, "plan": as_plan}


def generate(labelled: list[tuple[str, str]]) -> tuple[dict, dict]:
    """(entries, bodies) for ``(release label, topk.py text)`` pairs."""
    live = _live_topk()
    entries: dict[str, dict] = {}
    bodies: dict[str, str] = {}
    for label, text in labelled:
        for source, body in variants(label, text):
            fp, entry = entry_for(body, live)
            known = entries.setdefault(fp, {**entry, "sources": []})
            if (known["form"], known["plan"]) != (entry["form"], entry["plan"]):
                raise RuntimeError(f"{source}: one body, two behaviours: {known} / {entry}")
            known["sources"].append(source)
            bodies[fp] = topk_source.function_text(ledger.read(body).node)
            print(f"[ledger] {source}: {entry['form']} {fp[:12]}", flush=True)
    return entries, bodies


def write(entries: dict, bodies: dict) -> None:
    doc = {"generated_by": "tools/compat/ledger.py", "entries": dict(sorted(entries.items()))}
    ledger.LEDGER_FILE.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    topk_source.BODIES_FILE.write_text(json.dumps(dict(sorted(bodies.items())), indent=0) + "\n")


def main(argv: list[str]) -> int:
    if argv[:1] not in (["write"], ["check"]):
        print(__doc__)
        return 2
    entries, bodies = generate([(f"sglang {v}", wheel_topk(v)) for v in VERSIONS])
    if argv[0] == "write":
        write(entries, bodies)
        print(f"[ledger] {len(entries)} bodies from {len(VERSIONS)} releases")
        return 0
    committed = json.loads(ledger.LEDGER_FILE.read_text())["entries"]
    if committed != entries:
        print("[ledger] the committed ledger differs: run `python tools/compat/ledger.py write`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
