"""Regenerate the plugin's ledger of SGLang bodies from the real release wheels.

For every SGLang release on the registry that has ``_post_process_topk_ids``
(:data:`VERSIONS`, and those ``add`` put in the ledger), this reads ``topk.py`` out of the
release's wheel (downloaded once into ``.cache/wheels``; nothing is installed), and for
that text, each shipped patch's result where the patch applies, and the never-released
``mask-under-eplb-guard`` body (upstream PR 28378 reversed:
``sglang_amd_moe/diagnostics/e2e/guard_form/*.diff``, where one applies; with the shipped
patches on top), it

* fingerprints the function (``sglang_amd_moe.runtime.sglang.ledger``), with the helpers it
  reaches in the release's other modules read out of the same wheel;
* runs it with the plugin's probe: its own module-level code (the function, the helpers
  and flags it uses, its ``TopKConfig``) is compiled over a copy of the installed main
  release's topk module, which supplies what it imports;
* names the form by that behaviour and the plan by the hook's own ``decide``.

It writes ``ledger.json`` (fingerprint -> form, plan, sources; the releases it was read
from and the date it was built) and ``ledger_bodies.json`` (the normalised function of
each, for the audit's diff) into the package. A body whose behaviour no form names, that
the probe cannot run, or that uses a name its module rebinds other than by a statement,
stops the tool: look at it first.

Usage::

    python tools/compat/ledger.py write       # download what is missing, regenerate
    python tools/compat/ledger.py check       # exit 1 when the committed ledger differs
    python tools/compat/ledger.py missing     # registry releases the ledger lacks (exit 1
                                              # when there are any)
    python tools/compat/ledger.py add         # add each missing release: its bodies'
                                              # fingerprints, forms and coverage rows

``add`` is what a maintainer runs when SGLang releases (``make compat`` runs it too): it
asks the registry (``pip index versions sglang --pre``) for every release, pre-releases
included, and adds those from :data:`ABSENT_BELOW` on that the ledger does not list.
"""

from __future__ import annotations

import os

# On this CPU, Triton kernels a release's topk.py defines run in Triton's interpreter
# (read once, when triton is first imported).
os.environ.setdefault("TRITON_INTERPRET", "1")

import ast  # noqa: E402
import dataclasses  # noqa: E402
import datetime
import functools
import importlib
import inspect
import json
import re
import subprocess
import sys
import types
import warnings
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import build_env  # a sibling module (tools/compat)

from sglang_amd_moe.diagnostics import patching, topk_source
from sglang_amd_moe.diagnostics.topk_source import function_from_source
from sglang_amd_moe.runtime.sglang import hook, ledger, names
from sglang_amd_moe.runtime.sglang.probe import probe
from sglang_amd_moe.runtime.target import Refusal

REPO = Path(__file__).resolve().parents[2]
#: Every release on the registry with the function (0.5.9 and earlier have none); ``add``
#: extends the ledger's own list (``ledger.json``'s ``releases``) beyond it.
VERSIONS = (
    "0.5.10rc0",
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
#: Registry releases older than this have no ``_post_process_topk_ids`` (read from their
#: wheels: 0.5.9 and earlier); ``missing`` does not list them.
ABSENT_BELOW = "0.5.10rc0"


def wheel_topk(version: str) -> str:
    """The release's ``topk.py``, read out of its wheel."""
    whl = build_env.fetch_wheel([sys.executable, "-m", "pip"], version)
    with zipfile.ZipFile(whl) as zf:
        return zf.read(TOPK_IN_WHEEL).decode()


def wheel_modules(version: str) -> ledger.Modules:
    """The release's SGLang modules, read out of its wheel (what the fingerprint follows
    from topk.py into the modules it imports from)."""
    whl = build_env.fetch_wheel([sys.executable, "-m", "pip"], version)
    return _zip_modules(str(whl))


def release_modules(rel: Any) -> ledger.Modules | str:
    """Where a release's modules are (``releases.Release``): its environment's topk.py
    when built (the package beside it), else its wheel."""
    path = rel.topk_path()
    return str(path) if path is not None else wheel_modules(rel.version)


@functools.cache
def _zip_modules(whl: str) -> ledger.Modules:
    zf = zipfile.ZipFile(whl)
    files = set(zf.namelist())

    @functools.cache
    def find(name: str) -> tuple[str, bool] | None:
        base = name.replace(".", "/")
        for path, is_package in ((f"{base}/__init__.py", True), (f"{base}.py", False)):
            if path in files:
                return zf.read(path).decode(), is_package
        return None

    return find


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


def entry_for(
    text: str, live: types.ModuleType, modules: ledger.Modules | None = None
) -> tuple[str, dict[str, Any]]:
    """(fingerprint, {form, plan}) of the function ``text`` defines, by running it;
    ``modules``: the release's other modules (default: the installed SGLang's)."""
    reading = ledger.read(text, modules=modules)
    if reading.rebound:
        raise RuntimeError(f"a name the body uses is rebound: {reading.rebound}")
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
    entry = {"form": observed.behaviour, "plan": as_plan, "local": reading.local}
    return reading.fingerprint, entry


def generate(
    labelled: Iterable[tuple[str, str]],
    modules_of: Callable[[str], ledger.Modules] | None = None,
) -> tuple[dict, dict]:
    """(entries, bodies) for ``("sglang <version>", topk.py text)`` pairs; the helpers
    each body calls are read from ``modules_of(version)`` (default: its wheel)."""
    live = _live_topk()
    entries: dict[str, dict] = {}
    bodies: dict[str, str] = {}
    for label, text in labelled:
        modules = (modules_of or wheel_modules)(label.split()[-1])
        for source, body in variants(label, text):
            fp, entry = entry_for(body, live, modules)
            known = entries.setdefault(fp, {**entry, "sources": []})
            if (known["form"], known["plan"]) != (entry["form"], entry["plan"]):
                raise RuntimeError(f"{source}: one body, two behaviours: {known} / {entry}")
            known["sources"].append(source)
            bodies[fp] = topk_source.function_text(ledger.read(body, modules=modules).node)
            print(f"[ledger] {source}: {entry['form']} {fp[:12]}", flush=True)
    return entries, bodies


def committed() -> dict[str, Any]:
    """The committed ledger document."""
    return json.loads(ledger.LEDGER_FILE.read_text(encoding="utf-8"))


def versions() -> list[str]:
    """Every release the ledger is built from: :data:`VERSIONS` and those ``add`` added."""
    return _sorted({*VERSIONS, *committed().get("releases", [])})


def _sorted(vs: Iterable[str]) -> list[str]:
    from packaging.version import Version

    return sorted(vs, key=Version)


def write(entries: dict, bodies: dict, releases: Iterable[str], built: str | None = None) -> None:
    doc = {
        "generated_by": "tools/compat/ledger.py",
        "built": built or datetime.date.today().isoformat(),
        "releases": _sorted(releases),
        "entries": dict(sorted(entries.items())),
    }
    ledger.LEDGER_FILE.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    topk_source.BODIES_FILE.write_text(json.dumps(dict(sorted(bodies.items())), indent=0) + "\n")
    ledger._document.cache_clear()
    ledger.entries.cache_clear()


# --- releases the ledger does not have yet ----------------------------------------------------


def registry_versions() -> list[str]:
    """Every SGLang release on the registry, pre-releases included (``pip index``)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "sglang", "--pre"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    m = re.search(r"^Available versions:\s*(.+)$", out, re.M)
    if m is None:
        raise RuntimeError(f"pip index printed no version list: {out[-500:]!r}")
    return [v.strip() for v in m.group(1).split(",") if v.strip()]


def missing(available: Iterable[str], known: Iterable[str]) -> list[str]:
    """Releases in ``available`` (the registry's) from :data:`ABSENT_BELOW` on that are
    not in ``known`` (the ledger's), oldest first."""
    from packaging.version import InvalidVersion, Version

    have = set(known)
    floor = Version(ABSENT_BELOW)
    out = []
    for v in available:
        try:
            if Version(v) >= floor and v not in have:
                out.append(v)
        except InvalidVersion:
            continue
    return _sorted(out)


def add(
    new: list[str],
    topk: Callable[[str], str | None] | None = None,
    coverage_hook: Callable[[str], None] | None = None,
    modules_of: Callable[[str], ledger.Modules] | None = None,
) -> dict[str, Any]:
    """Add each release of ``new`` to the committed ledger in one step: its bodies (the
    release, the guard form rebuilt from it, the shipped patches on either) fingerprinted
    with the helpers from its own wheel, their forms and plans by running them, and its
    coverage rows. A release without the function is listed (not asked about again) with
    no body. ``topk``: version -> topk.py text (None: no such file); ``coverage_hook``:
    version -> None, adds its coverage rows once the ledger has the release (default
    :func:`add_coverage`); ``modules_of``:
    version -> its modules (default: its wheel's). Returns the new document."""
    doc = committed()
    entries: dict[str, dict] = doc["entries"]
    bodies = json.loads(topk_source.BODIES_FILE.read_text(encoding="utf-8"))
    topk = topk or _wheel_topk_or_none
    for v in new:
        text = topk(v)
        if text is not None and ledger.read(text, modules=lambda _: None).binding != "absent":
            got, got_bodies = generate([(f"sglang {v}", text)], modules_of)
            for fp, e in got.items():
                old = entries.setdefault(fp, {**e, "sources": []})
                if (old["form"], old["plan"]) != (e["form"], e["plan"]):
                    raise RuntimeError(f"sglang {v}: one body, two behaviours: {old} / {e}")
                old["sources"] = [
                    *old["sources"],
                    *(s for s in e["sources"] if s not in old["sources"]),
                ]
            bodies.update(got_bodies)
        else:
            print(f"[ledger] sglang {v}: no {names.FUNCTION_NAME}: listed, no body", flush=True)
    write(entries, bodies, [*versions(), *new])
    for v in new:  # after the ledger has them: the coverage rows name each body's form
        (coverage_hook or add_coverage)(v)
    return committed()


def _wheel_topk_or_none(version: str) -> str | None:
    try:
        return wheel_topk(version)
    except KeyError:  # the wheel has no topk.py
        return None


def add_coverage(version: str) -> None:
    """The coverage rows of ``version``: ``tools/compat/coverage_table.py``'s
    ``add_release`` (its wheel read, the committed table, docs/coverage.md and the
    README's table regenerated with it)."""
    import coverage_table  # a sibling module (tools/compat)

    rec = coverage_table.add_release(version)
    print(f"[ledger] sglang {version}: coverage rows added (form {rec['form']})", flush=True)


def main(argv: list[str]) -> int:
    cmd = argv[:1]
    if cmd in (["missing"], ["add"]):
        try:
            available = registry_versions()
        except (OSError, subprocess.CalledProcessError, RuntimeError) as exc:
            print(f"[ledger] the registry could not be asked for SGLang's releases: {exc}")
            return 2
        new = missing(available, versions())
        print(f"[ledger] registry releases not in the ledger: {', '.join(new) or 'none'}")
        if cmd == ["missing"]:
            return 1 if new else 0
        if new:
            add(new)
            print(f"[ledger] added {', '.join(new)}; built {ledger.built()}")
        return 0
    if cmd not in (["write"], ["check"]):
        print(__doc__)
        return 2
    vs = versions()
    entries, bodies = generate([(f"sglang {v}", wheel_topk(v)) for v in vs])
    if argv[0] == "write":
        write(entries, bodies, vs)
        print(f"[ledger] {len(entries)} bodies from {len(vs)} releases")
        return 0
    if committed()["entries"] != entries:
        print("[ledger] the committed ledger differs: run `python tools/compat/ledger.py write`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
