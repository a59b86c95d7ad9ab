"""Extract the peer kernels we benchmark against from the SGLang 0.5.23 wheel.

Run here (where the wheel is cached or downloadable), before a device run; the output
folder ``benchmarks/_peers/`` is git-ignored and travels to the GPU machine with
``carry``. Nothing extracted is ever committed:

* ``moe_align.py``: ``sglang/test/kernels/moe_align.py`` (``moe_align_block_size_triton``,
  SGLang's four-launch Triton MoE align/sort);
* ``fill_padded_rows.py``: ``sglang/kernels/ops/moe/fill_padded_rows.py``
  (``_fill_padded_rows``, what SGLang 0.5.23 calls twice per layer on HIP).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PEERS = HERE / "_peers"
MEMBERS = {
    "sglang/test/kernels/moe_align.py": "moe_align.py",
    "sglang/kernels/ops/moe/fill_padded_rows.py": "fill_padded_rows.py",
}


def wheel_path() -> Path:
    """The main test release's wheel, from the test environments' wheel cache
    (``tools/compat/releases.py wheel`` prints its path last, after any download log)."""
    out = subprocess.run(
        [sys.executable, str(REPO / "tools" / "compat" / "releases.py"), "wheel"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def main() -> int:
    PEERS.mkdir(exist_ok=True)
    wheel = wheel_path()
    release = wheel.name.split("-")[1]  # sglang-<version>-<tags>.whl
    with zipfile.ZipFile(wheel) as zf:
        for member, name in MEMBERS.items():
            (PEERS / name).write_bytes(zf.read(member))
            print(f"extracted {member} -> {PEERS / name}")
    (PEERS / "SOURCE.txt").write_text(f"extracted from sglang=={release}: {', '.join(MEMBERS)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
