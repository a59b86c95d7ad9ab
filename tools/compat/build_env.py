"""Build environments that hold one real SGLang release each, sharing one torch.

SGLang's full dependency set (CUDA kernels, flashinfer, ...) cannot be installed on
a CPU-only machine, and is not needed: the plugin only touches
``sglang.srt.layers.moe.topk`` and ``sglang.srt.plugins``. So a release is installed
with ``--no-deps`` and then only the packages its import needs (``IMPORT_CLOSURE``),
each pinned as the release's own wheel metadata pins it (``Requires-Dist``), so every
release is tested against the versions it declares.

Layouts:

* ``--into VENV``: install the release (and its pinned closure) into an existing
  virtual environment (the main ``.venv``, which also holds torch and this package).
* ``--dest DIR --shared VENV``: make a new virtual environment ``DIR`` whose
  ``site-packages`` ends with the shared venv's (a ``.pth`` line calling
  ``site.addsitedir``, so the shared venv's own ``.pth`` files, such as this
  package's editable finder, run too). Packages installed in ``DIR`` shadow the
  shared ones; torch, triton and this package come from the shared venv.

``--patch FILE`` applies a unified diff to the installed release afterwards (used to
rebuild the never-released ``mask-under-eplb-guard`` form from 0.5.14).

Every step is logged; any failure exits non-zero with the reason. The import of
``sglang.srt.layers.moe.topk`` is checked at the end in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

# What importing sglang.srt.layers.moe.topk (and sglang.srt.plugins) needs, across
# the releases we test, beyond torch/torchvision/triton (shared). Names as on the
# registry; each gets the release's own pin when its metadata declares one.
IMPORT_CLOSURE = [
    "aiohttp",
    "apache-tvm-ffi",
    "compressed-tensors",
    "dill",
    "einops",
    "gguf",
    "httpcore",
    "httpx",
    "IPython",
    "msgspec",
    "openai",
    "orjson",
    "partial_json_parser",
    "pillow",
    "psutil",
    "pybase64",
    "pydantic",
    "pyzmq",
    "requests",
    "sentencepiece",
    "sniffio",
    "starlette",
    "tqdm",
    "transformers",
    "tokenizers",
    "xgrammar",
]
# Installed in the shared venv once; never re-pinned per release (one torch for all).
SHARED = {"torch", "torchvision", "torchaudio", "triton"}

REPO = Path(__file__).resolve().parents[2]
WHEEL_CACHE = REPO / ".cache" / "wheels"


def log(msg: str) -> None:
    print(f"[build_env] {msg}", flush=True)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def run(cmd: list[str], **kw) -> None:
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kw)


def fetch_wheel(pip: list[str], version: str) -> Path:
    """Download (or reuse) the sglang wheel of ``version`` into the cache."""
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    pattern = f"sglang-{version}-*.whl"
    found = sorted(WHEEL_CACHE.glob(pattern))
    if not found:
        # Into a private folder, then renamed into the cache: processes fetching the same
        # wheel at once (parallel test workers, parallel builds) never read a partial file.
        with tempfile.TemporaryDirectory(dir=WHEEL_CACHE, prefix=".download-") as tmp:
            run([*pip, "download", "-q", "--no-deps", f"sglang=={version}", "-d", tmp])
            for got in Path(tmp).glob(pattern):
                os.replace(got, WHEEL_CACHE / got.name)
        found = sorted(WHEEL_CACHE.glob(pattern))
    if not found:
        raise SystemExit(f"no wheel for sglang=={version} after download")
    return found[0]


def release_pins(wheel: Path) -> dict[str, str]:
    """Map normalized name -> requirement string, from the wheel's Requires-Dist.

    Only unconditional requirements and those whose marker holds on Linux x86_64
    without extras are kept; the marker is evaluated with ``packaging``.
    """
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = zf.read(meta_name).decode()
    pins: dict[str, str] = {}
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        pins[_norm(req.name)] = str(req).split(";")[0].strip()
    return pins


def closure_requirements(pins: dict[str, str]) -> list[str]:
    reqs = []
    for name in IMPORT_CLOSURE:
        req = pins.get(_norm(name), name)
        # Extras of a pin (e.g. flashinfer[cu13]) are irrelevant to the closure.
        reqs.append(re.sub(r"\[[^\]]*\]", "", req))
    return reqs


def site_packages(venv: Path) -> Path:
    out = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def make_layered_venv(dest: Path, shared: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    run([sys.executable, "-m", "venv", "--without-pip", str(dest)])
    write_layer_pth(site_packages(dest), site_packages(shared))


#: The layer's .pth file in a layered venv's own site-packages.
LAYER_PTH = "zz_shared_venv.pth"


def write_layer_pth(own_sp: Path, shared_sp: Path) -> None:
    """Put ``shared_sp`` after the venv's own site-packages (its packages win, the shared
    venv supplies the rest) and run the shared venv's .pth files, except this package's
    editable install: a layered environment never sees the source tree, it gets this
    package from its wheel (``releases.py install-wheel``)."""
    # One line, run by exec() in site's own frame: a comprehension there cannot see the
    # names the line binds, so the loop body reaches them through a lambda's default.
    code = (
        f"import os, sys; d = {str(shared_sp)!r}; sys.path.append(d); "
        "list(map(lambda n, d=d: __import__('site').addpackage(d, n, set()), "
        "[n for n in sorted(os.listdir(d)) if n.endswith('.pth') and 'sglang_amd_moe' not in n]))"
    )
    tmp = own_sp / f".{LAYER_PTH}.tmp"
    tmp.write_text(code + "\n")
    os.replace(tmp, own_sp / LAYER_PTH)


def apply_patch(venv: Path, patch_file: Path) -> None:
    """Apply a one-file unified diff to the installed release with the project's own
    applier (``sglang_amd_moe.diagnostics.patching``, as ``releases.topk_source`` does), so building
    needs no ``patch`` program."""
    # Imported here, not at the top: the first run of this script builds .venv itself,
    # before this package is installed into it; patches are applied only to later
    # environments, by .venv's interpreter, where the package is installed (editable).
    from sglang_amd_moe.diagnostics import patching

    text = patch_file.read_text()
    # Patches are written against the upstream repository layout (python/sglang/...);
    # inside an installed release the package sits at site-packages/sglang.
    rel_path = patching.parse(text)[0].new_path.removeprefix("b/").removeprefix("python/")
    target = site_packages(venv) / rel_path
    target.write_text(patching.apply_text(target.read_text(), text))
    log(f"applied {patch_file.name} to {target}")


def check_import(python: Path) -> dict:
    """Import the topk module in a fresh interpreter of the new environment.

    A release with a plugin loader must import it (the plugin hooks it in-process). A
    release without one (0.5.10) cannot load the plugin at all, so its topk need not
    import on this CPU machine (0.5.10's pulls in sgl_kernel, which needs CUDA's NVRTC):
    the failure is recorded as ``topk_import_error`` and the environment still serves the
    ledger, the audit and the patch checks, which only read its files.
    """
    code = (
        "import json, time, importlib.metadata as md, importlib.util as u; t=time.time();"
        "loader = u.find_spec('sglang.srt.plugins') is not None;"
        "info = {'sglang': md.version('sglang'), 'has_plugin_loader': loader};"
        "import sglang.srt.layers.moe.topk as t_;"
        "info.update(file=t_.__file__, import_s=round(time.time()-t, 1));"
        "print(json.dumps(info))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if out.returncode == 0:
        return json.loads(out.stdout.strip().splitlines()[-1])
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util as u; print(u.find_spec('sglang.srt.plugins') is not None)",
        ],
        capture_output=True,
        text=True,
    )
    has_loader = probe.stdout.strip() != "False"
    error = (out.stderr.strip().splitlines() or ["?"])[-1]
    if has_loader:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"importing sglang.srt.layers.moe.topk failed with {python}: {error}")
    log(f"topk does not import here ({error}); recorded: this release has no plugin loader")
    return {"has_plugin_loader": False, "topk_import_error": error}


def build(
    version: str,
    *,
    into: Path | None,
    dest: Path | None,
    shared: Path | None,
    patch: Path | None,
    label: str | None,
) -> Path:
    t0 = time.time()
    if into is not None:
        venv = into
    else:
        if dest is None or shared is None:
            raise SystemExit("--dest needs --shared")
        make_layered_venv(dest, shared)
        venv = dest
    # pip of the shared/main venv, pointed at the target interpreter's environment.
    py = venv / "bin" / "python"
    pip_host = (shared or into) / "bin" / "python"
    pip = (
        [str(pip_host), "-m", "pip", "--python", str(py)]
        if into is None
        else [str(py), "-m", "pip"]
    )
    wheel = fetch_wheel([str(pip_host), "-m", "pip"], version)
    pins = release_pins(wheel)
    reqs = closure_requirements(pins)
    log(f"sglang {version}: closure pinned as {reqs}")
    run([*pip, "install", "-q", "--no-deps", str(wheel)])
    run([*pip, "install", "-q", *reqs])
    if patch is not None:
        apply_patch(venv, patch)
    info = check_import(py)
    info.update(
        {
            "label": label or version,
            "release": version,
            "patch": str(patch) if patch else None,
            "build_s": round(time.time() - t0, 1),
        }
    )
    (venv / "sglang_release.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"ready: {info}")
    return venv


def build_layer(dest: Path, shared: Path, requirements: list[str]) -> Path:
    """A layered venv on ``shared`` with extra packages only (no SGLang of its own).

    Used for the server test's extras (fastapi, uvicorn, ...), which must never go into
    the shared venv itself.
    """
    make_layered_venv(dest, shared)
    run(
        [
            str(shared / "bin" / "python"),
            "-m",
            "pip",
            "--python",
            str(dest / "bin" / "python"),
            "install",
            "-q",
            *requirements,
        ]
    )
    (dest / "layer.json").write_text(json.dumps({"requirements": requirements}, indent=2) + "\n")
    log(f"ready: layer {dest} with {requirements}")
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", help="SGLang release, e.g. 0.5.13.post1")
    ap.add_argument(
        "--layer",
        nargs="+",
        metavar="REQ",
        help="with --dest/--shared: only these extra packages, no SGLang",
    )
    ap.add_argument("--into", type=Path, help="existing venv to install into")
    ap.add_argument("--dest", type=Path, help="new layered venv to create")
    ap.add_argument("--shared", type=Path, help="venv that supplies torch and this package")
    ap.add_argument("--patch", type=Path, help="unified diff to apply after installing")
    ap.add_argument("--label", help="name recorded in sglang_release.json")
    a = ap.parse_args(argv)
    if (a.into is None) == (a.dest is None):
        ap.error("give exactly one of --into or --dest")
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    if a.layer:
        if a.dest is None or a.shared is None:
            ap.error("--layer needs --dest and --shared")
        build_layer(a.dest, a.shared, a.layer)
        return 0
    if not a.version:
        ap.error("--version is required")
    build(a.version, into=a.into, dest=a.dest, shared=a.shared, patch=a.patch, label=a.label)
    return 0


if __name__ == "__main__":
    sys.exit(main())
