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

# The release and the wheel cache of the test environments (tests/compat).
sys.path.insert(0, str(REPO / "tools" / "compat"))
from build_env import fetch_wheel  # noqa: E402
from releases import MAIN_RELEASE as RELEASE  # noqa: E402

sys.path.pop(0)


def wheel_path() -> Path:
    return fetch_wheel([sys.executable, "-m", "pip"], RELEASE)


def main() -> int:
    PEERS.mkdir(exist_ok=True)
    with zipfile.ZipFile(wheel_path()) as zf:
        for member, name in MEMBERS.items():
            (PEERS / name).write_bytes(zf.read(member))
            print(f"extracted {member} -> {PEERS / name}")
    (PEERS / "SOURCE.txt").write_text(f"extracted from sglang=={RELEASE}: {', '.join(MEMBERS)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
