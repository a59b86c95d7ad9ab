"""Run the variants of one base release in that release's interpreter.

Usage (cwd ``tests/sglang``, ``PYTHONPATH`` = an overlay made by
:func:`variants.overlay.make`)::

    python -m variants.runner OUT.json BASE_LABEL OVERLAY BASE_TOPK [NAME ...]

For each variant: its files are written into the overlay's ``sglang/srt/layers/moe/``
(the overlay mirrors the release's ``sglang`` package with symbolic links, so the
variant *is* the installed ``topk.py``: the plugin's file reading and SGLang's import
both see it); the topk module, the plugin's state, SGLang's ``HookRegistry`` and its
once-per-process guard are reset; then, as in a fresh server process, the real
``load_plugins()`` runs before anything imports topk. Then the HIP branch is taken on
this CPU (the module's HIP flags set, as ``driver.py`` does) and the function is driven
EPLB off and on, without the plugin (the unwrapped function) and with it. Importing
topk once costs seconds; each further variant re-imports only topk itself.

Where the plugin asks for a verdict (a body the ledger does not know), its child process
is a fork of this runner (:func:`forked_child`), not a fresh interpreter: the child's code
(``runtime/sglang/child.py``'s ``verdict``) and everything the plugin does with its answer
are the product's, but the 5-7 s a fresh interpreter spends importing SGLang again is
spent once per release, not once per variant. The fresh interpreter itself (its path,
its environment, its time limit, the cache and its lock) is tested on real releases by
``test_probe_child.py`` and ``test_hook_decisions.py``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import select
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import driver

from variants import DoesNotApply, Variant
from variants.catalog import IMPL, VARIANTS

TOPK = driver.TOPK_MODULE
EXTRA_MODULES = (f"sglang.srt.layers.moe.{IMPL}",)


def reset() -> None:
    """A process state as before the first ``load_plugins()``, topk not imported."""
    from sglang_amd_moe.runtime.sglang import hook as sglang_hook

    sglang_hook.uninstall()
    for name in (TOPK, *EXTRA_MODULES):
        sys.modules.pop(name, None)
    plugins = driver.plugin_loader()
    if plugins is not None:
        from sglang.srt.plugins.hook_registry import HookRegistry

        HookRegistry.reset()
        plugins._plugins_loaded = False
    os.environ.pop("SGLANG_AMD_MOE_VERIFY", None)
    os.environ["SGLANG_AMD_MOE_FORCE"] = "1"


def forked_child(
    request: dict[str, Any], limit: float | None = None
) -> tuple[dict | None, str, float]:
    """``verdict.run_child``'s contract (``(document, "", seconds)`` or ``(None, why,
    seconds)``), with the child a fork of this process: it runs the child module's
    ``verdict`` on ``request`` and writes the document to a pipe."""
    from sglang_amd_moe.runtime.sglang import child, verdict

    limit = verdict.timeout() if limit is None else limit
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: no return from here
        os.close(read_fd)
        code = 0
        try:
            data = json.dumps(child.verdict(request)).encode()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, as the child does
            data, code = f"sglang-amd-moe probe child: {type(exc).__name__}: {exc}".encode(), 3
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(data)
        os._exit(code)
    os.close(write_fd)
    chunks: list[bytes] = []
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        while True:
            left = limit - (time.monotonic() - t0)
            if left <= 0 or not select.select([pipe], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                why = f"the child process ran past its {limit:g} s limit and was killed"
                return None, why, time.monotonic() - t0
            chunk = pipe.read(65536)
            if not chunk:
                break
            chunks.append(chunk)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    seconds = time.monotonic() - t0
    data = b"".join(chunks)
    if status != 0:
        return None, f"the child process exited with {status} ({data.decode()[-300:]})", seconds
    return json.loads(data), "", seconds


def threads_register(result: dict) -> None:
    """``register()`` from four threads released at once."""
    from sglang_amd_moe.runtime.plugin import register

    barrier = threading.Barrier(4)
    raised: list[str] = []

    def one() -> None:
        barrier.wait()
        try:
            register()
        except BaseException as exc:
            raised.append(repr(exc))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result["load_raised"] = "; ".join(raised) or None


def our_layers(fn: Any) -> int:
    """How many of this package's wrappers are in ``fn``'s chain."""
    from sglang_amd_moe.runtime.sglang import hook as sglang_hook
    from sglang_amd_moe.runtime.target import MARK, closes_over

    n = 0
    for _ in range(32):
        if fn is None:
            break
        if getattr(fn, MARK, None) is not None or closes_over(fn, sglang_hook._around):
            n += 1
        fn = getattr(fn, "__wrapped__", None)
    return n


def emulate_hip(tk: Any, fn: Any, flags: tuple[str, ...]) -> None:
    driver.take_hip_branch(tk, fn, flags)
    for g in {
        id(vars(tk)): vars(tk),
        id(inspect.unwrap(fn).__globals__): inspect.unwrap(fn).__globals__,
    }.values():
        if "is_hip" in g:
            g["is_hip"] = lambda: True


def drive(batch: driver.Batch, eplb: driver.Eplb) -> dict:
    """EPLB off (no dispatch info, and a real one passed) and on; padded and not."""
    import torch

    real, perm = batch.real_ids.to(torch.long), batch.perm.to(torch.long)
    want_off, want_on = real.tolist(), perm[real].tolist()
    wrong: list[str] = []
    calls: dict[str, Any] = {}

    def one(name: str, info_fn, eplb_on: bool) -> None:
        eplb.publish(
            **({"enable_eplb": True, "ep_dispatch_algorithm": "static"} if eplb_on else {})
        )
        try:
            info = info_fn()
            padded = batch.call(info)
            unpadded = batch.call(info, padded=False)
        except Exception as exc:
            wrong.append(f"{name}: raised {type(exc).__name__}: {str(exc)[:120]}")
            return
        calls[name] = padded
        want = want_on if eplb_on else want_off
        pad_ids = [x for row in padded["ids"][driver.N_REAL :] for x in row]
        pad_w = [x for row in padded["w"][driver.N_REAL :] for x in row]
        if not all(0 <= x < driver.E for x in pad_ids):
            wrong.append(f"{name}: padded ids {sorted(set(pad_ids))[:4]}")
        if any(x != 0 for x in pad_w):
            wrong.append(f"{name}: padded weights {sorted({str(x) for x in pad_w})[:2]}")
        if padded["ids"][: driver.N_REAL] != want:
            wrong.append(f"{name}: real ids not {'remapped once' if eplb_on else 'as given'}")
        if padded["w_bits"][: driver.N_REAL] != batch.real_w.view(torch.int32).tolist():
            wrong.append(f"{name}: real weights changed")
        if unpadded["ids"] != want or unpadded["w_bits"] != padded["w_bits"][: driver.N_REAL]:
            wrong.append(f"{name}: the unpadded call differs")

    one("eplb-off", lambda: None, False)
    one("eplb-off+info", eplb.direct_info, False)
    one("eplb-on", eplb.info, True)
    eplb.publish()
    return {"right": not wrong, "wrong": wrong}


def run_variant(
    v: Variant, base_text: str, moe_dir: Path, logs: driver.Collect, written: set[str]
) -> dict:
    from sglang_amd_moe.diagnostics import topk_source
    from sglang_amd_moe.runtime.sglang import hook as sglang_hook
    from sglang_amd_moe.runtime.sglang import ledger
    from sglang_amd_moe.runtime.sglang import probe as sglang_probe

    t0 = time.perf_counter()
    out: dict[str, Any] = {"name": v.name, "base": v.base, "timings": {}}
    try:
        files = v.build(base_text)
    except DoesNotApply as exc:
        out["does_not_apply"] = str(exc)
        return out
    for name in written - set(files):
        (moe_dir / name).unlink(missing_ok=True)
    written.clear()
    for name, text in files.items():
        if name != "topk.py":
            written.add(name)
        (moe_dir / name).write_text(text)
    reset()
    reading = ledger.read(files["topk.py"])
    out["classifier"] = {"form": reading.form, "reason": reading.why, "binding": reading.binding}
    first_log = len(logs.records)
    t = time.perf_counter()
    if v.load == "threads":
        threads_register(out)
    else:
        res: dict = {"timings": {}}
        driver.load(res, "load")
        out["load_raised"] = res["load_raised"]
    out["timings"]["load"] = round(time.perf_counter() - t, 3)

    def decided() -> None:  # at load, or when topk is imported (a body not known as fixed)
        st = sglang_hook.status()
        out["status"] = driver.status_dict(st)
        detail = dict(st.detail) if st is not None else {}
        out["plan"] = detail.get("plan")
        out["plugin_probe"] = (detail.get("probe") or {}).get("behaviour")
        out["plugin_probe_s"] = (detail.get("probe") or {}).get("seconds")
        out["plugin_classifier"] = (detail.get("file") or {}).get("form")
        out["summary_lines"] = [
            r
            for r in logs.records[first_log:]
            if r["logger"] == "sglang_amd_moe" and r["msg"].startswith("sglang-amd-moe: sglang ")
        ]

    try:
        tk = importlib.import_module(TOPK)
    except BaseException as exc:  # a SystemExit variant included
        decided()
        out["import_error"] = f"{type(exc).__name__}: {exc}"
        out["timings"]["total"] = round(time.perf_counter() - t0, 3)
        return out
    decided()
    live = tk._post_process_topk_ids
    upstream = inspect.unwrap(live)
    emulate_hip(tk, live, v.hip_flags)
    out["our_layers"] = our_layers(live)
    observed = sglang_probe.probe(upstream, hip_flags=v.hip_flags, predicates=reading.predicates)
    out["probe"] = {
        "behaviour": observed.behaviour,
        "findings": list(observed.findings),
        "why": observed.why,
    }
    out["probe_s"] = round(observed.seconds, 4)
    batch = driver.Batch.make(tk)
    batch.count_param = v.count_param
    eplb = driver.Eplb(batch)
    batch.fn = upstream
    out["bare"] = drive(batch, eplb)
    batch.fn = None
    out["hooked"] = drive(batch, eplb)
    out["our_layers_after"] = our_layers(tk._post_process_topk_ids)
    seen = topk_source.probe_live()  # what the audit asks: the call as it runs now
    if seen is not None:
        out["observe"] = {"correct": seen.correct, "behaviour": seen.behaviour}
    else:
        out["observe"] = None
    out["timings"]["total"] = round(time.perf_counter() - t0, 3)
    return out


def patch_checks(base_text: str, moe_dir: Path) -> list[dict]:
    """The audit's check of a patch before offering it, on this release: the shipped
    patch for its form, applied to its topk.py, probed (``topk_source.probe_source``);
    and the same patch with its added lines naming a parameter the function does not
    have (it still applies; every HIP call would raise NameError)."""
    from sglang_amd_moe.diagnostics import patching
    from sglang_amd_moe.diagnostics.topk_source import probe_source
    from sglang_amd_moe.runtime.sglang import ledger

    form = ledger.read(base_text).form
    name = patching.patch_for("sglang", form)
    if name is None:
        return []
    (moe_dir / "topk.py").write_text(base_text)
    reset()
    tk = importlib.import_module(TOPK)
    patch = patching.read_patch(name)
    patched = patching.apply_text(base_text, patch)
    lines = patch.splitlines(True)
    renamed = "".join(
        ln.replace("num_token_non_padded", "num_tokens_unpadded") if ln.startswith("+    ") else ln
        for ln in lines
    )
    out = []
    for label, text in (
        ("as shipped", patched),
        ("names a missing parameter", patching.apply_text(base_text, renamed)),
    ):
        t = time.perf_counter()
        result = probe_source(tk, text)
        out.append(
            {
                "patch": name,
                "case": label,
                "classifier": ledger.read(text).form,
                "ran": result.ran,
                "correct": result.correct,
                "findings": list(result.findings[:3]),
                "why": result.why,
                "seconds": round(time.perf_counter() - t, 4),
            }
        )
    return out


def main(argv: list[str]) -> int:
    from sglang_amd_moe.runtime.sglang import verdict

    out_path, label, overlay, base_topk, *names = argv
    verdict.run_child = forked_child
    logs = driver.collect_logs()
    base_text = Path(base_topk).read_text()
    moe_dir = Path(overlay) / "sglang" / "srt" / "layers" / "moe"
    chosen = [v for v in VARIANTS if v.base == label and (not names or v.name in names)]
    results: list[dict] = []
    written: set[str] = set()
    t0 = time.perf_counter()
    for v in chosen:
        try:
            results.append(run_variant(v, base_text, moe_dir, logs, written))
        except BaseException as exc:
            results.append(
                {
                    "name": v.name,
                    "base": label,
                    "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}",
                }
            )
    for name in written:
        (moe_dir / name).unlink(missing_ok=True)
    try:
        checks = patch_checks(base_text, moe_dir) if not names else []
    except BaseException as exc:
        checks = [{"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}]
    (moe_dir / "topk.py").write_text(base_text)
    doc = {
        "label": label,
        "wall_s": round(time.perf_counter() - t0, 2),
        "variants": results,
        "patch_checks": checks,
    }
    Path(out_path).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
