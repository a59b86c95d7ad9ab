"""A mirror of an installed ``sglang`` package in which ``topk.py`` can be replaced.

Every entry is a symbolic link to the installed one, except the directories on the
way to ``sglang/srt/layers/moe`` (real directories) and ``topk.py`` there (a real file):
with the mirror first on ``PYTHONPATH``, ``import sglang`` and ``find_spec("sglang")``
find it, and whatever is written to its ``topk.py`` is what the process imports and
what the plugin reads, while the release's own files stay untouched.
"""

from __future__ import annotations

import shutil
from pathlib import Path

CHAIN = ("srt", "layers", "moe")


def make(sglang_dir: Path, dest: Path) -> Path:
    """Build the mirror of ``sglang_dir`` under ``dest``; return ``dest``."""
    src, out = Path(sglang_dir), Path(dest) / "sglang"
    if out.exists():
        shutil.rmtree(out)
    for depth in range(len(CHAIN) + 1):
        here_src = src.joinpath(*CHAIN[:depth])
        here_out = out.joinpath(*CHAIN[:depth])
        here_out.mkdir(parents=True, exist_ok=True)
        nxt = CHAIN[depth] if depth < len(CHAIN) else None
        for entry in here_src.iterdir():
            if entry.name == nxt:
                continue
            if depth == len(CHAIN) and entry.name == "topk.py":
                shutil.copyfile(entry, here_out / entry.name)
                continue
            (here_out / entry.name).symlink_to(entry)
    return Path(dest)
