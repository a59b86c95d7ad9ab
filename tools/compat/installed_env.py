"""Environments with this package's wheel installed, which cannot see the source tree.

``make test`` builds the wheel once and installs it (``pip install --no-deps``, as the
README tells users) into environments made from what ``.venv`` and the per-release
environments already hold, so that nothing is downloaded or built again:

* a virtual environment (no pip of its own; ``.venv``'s pip installs into it through
  ``pip --python``) whose ``sys.path`` ends with *views* of existing ``site-packages``
  folders: a folder of symbolic links to their entries, less those a view hides;
* a view never holds ``.pth`` files, so ``.venv``'s editable install of this package (a
  ``.pth`` finder that maps the package to the source tree) never runs, and it hides this
  package's own files and metadata, so the wheel is the only ``sglang_amd_moe`` there;
* the environments' own ``site-packages`` come first on ``sys.path``: the wheel wins.

Usage (the tests use :func:`make` directly)::

    python tools/compat/installed_env.py --dest DIR --wheel WHEEL \
        [--layer SITE ...] [--hide NAME ...]
"""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv"

#: What no view shows: this package's files, its metadata and editable finder, and every
#: ``.pth`` file (they run code at start-up; the editable finder is one).
ALWAYS_HIDDEN = (
    "sglang_amd_moe",
    "sglang_amd_moe-*",
    "sglang_amd_moe.*",
    "__editable__*",
    "*.pth",
    "__pycache__",
)
#: What a view of a layer hides when a later layer must not supply SGLang.
SGLANG = ("sglang", "sglang-*", "sglang.*")


#: What the wheel is built from: the package's folders and the files that describe it.
SOURCES = (
    "sglang_amd_moe",
    "kernels",
    "patches",
    "pyproject.toml",
    "setup.py",
    "README.md",
    "LICENSE",
)


def sources(untracked: bool = False) -> list[str]:
    """The repository's files the wheel is built from: tracked ones (a fresh clone's), and
    with ``untracked`` the new files git does not ignore (a working tree's next commit)."""
    cmd = ["git", "ls-files", "-z", "--cached"]
    if untracked:
        cmd += ["--others", "--exclude-standard"]
    out = subprocess.run([*cmd, "--", *SOURCES], cwd=REPO, capture_output=True, check=True)
    return sorted({f for f in out.stdout.decode().split("\0") if f and (REPO / f).is_file()})


def build_wheel(out: Path, files: list[str] | None = None) -> Path:
    """Build this package's wheel into ``out`` as users do (``pip wheel --no-deps``), from
    a copy of ``files`` (default: the tracked ones): setuptools reuses a ``build/`` folder
    left in the source tree, so stale modules there would end up in the wheel."""
    src = out / "src"
    for rel in sources() if files is None else files:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        check=True,
        timeout=600,
    )
    wheels = list(out.glob("sglang_amd_moe-*.whl"))
    if len(wheels) != 1:
        raise AssertionError(f"expected one wheel, got {wheels}")
    return wheels[0]


def purelib(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def _view(site: Path, dest: Path, hide: tuple[str, ...]) -> None:
    dest.mkdir(parents=True)
    for entry in sorted(site.iterdir()):
        if any(fnmatch.fnmatch(entry.name, pat) for pat in (*ALWAYS_HIDDEN, *hide)):
            continue
        (dest / entry.name).symlink_to(entry)


def make(
    dest: Path,
    wheel: Path,
    layers: list[tuple[Path, tuple[str, ...]]],
    base_python: Path = VENV / "bin" / "python",
) -> Path:
    """Create ``dest``: a venv over views of ``layers`` (``(site-packages, hidden names)``,
    first wins), with ``wheel`` installed into its own ``site-packages``; returns its
    python."""
    if dest.exists():
        raise FileExistsError(f"{dest} exists")
    subprocess.run([str(base_python), "-m", "venv", "--without-pip", str(dest)], check=True)
    python = dest / "bin" / "python"
    own = purelib(python)
    lines = []
    for i, (site, hide) in enumerate(layers):
        view = dest / f"view-{i}"
        _view(site, view, hide)
        lines.append(str(view))
    # Plain paths, not site.addsitedir: the views' .pth files must not run.
    (own / "zz_views.pth").write_text("\n".join(lines) + "\n")
    pip = [str(base_python), "-m", "pip", "--disable-pip-version-check", "--python", str(python)]
    subprocess.run(
        [*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    )
    return python


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", type=Path, required=True)
    ap.add_argument("--wheel", type=Path, required=True)
    ap.add_argument("--layer", type=Path, action="append", default=[], help="site-packages")
    ap.add_argument("--hide", action="append", default=[], help="names no view shows")
    args = ap.parse_args(argv)
    layers = [(site, tuple(args.hide)) for site in args.layer or [purelib(VENV / "bin/python")]]
    print(make(args.dest, args.wheel, layers))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
