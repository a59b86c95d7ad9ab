"""Pack sgl_kernel (sglang-kernel 0.4.3) small enough to carry to the lent GPU machine.

SGLang 0.5.13.post1 pins ``sglang-kernel==0.4.3`` (built for torch 2.11, the GPU
machine's torch). Its wheel is 323 MB, nearly all of it attention libraries that
neither the C++ ``moe_align_block_size`` peer of ``benchmarks/run.py`` nor SGLang's topk
(``tests/gpu/test_sglang_hook_gpu.py``) loads: without ``sgl_kernel/flash_ops.abi3.so``,
``sgl_kernel/flashmla_ops.abi3.so`` and ``sgl_kernel/sm100/`` the package imports and
runs on an H200. This downloads the wheel (cached under ``.cache/wheels``), keeps the
``sgl_kernel`` folder without those, and writes it as ``.whl/sgl_kernel-0.4.3.tar.xz``
(git-ignored); ``benchmarks/device.sh`` unpacks it there and puts it on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSION = "0.4.3"
DROP = ("sgl_kernel/flash_ops.abi3.so", "sgl_kernel/flashmla_ops.abi3.so", "sgl_kernel/sm100/")


def fetch(cache: Path) -> Path:
    found = sorted(cache.glob(f"sglang_kernel-{VERSION}-*.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp",
         "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
         "-d", str(cache), f"sglang-kernel=={VERSION}"],
        check=True,
    )  # fmt: skip
    return sorted(cache.glob(f"sglang_kernel-{VERSION}-*.whl"))[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=REPO / ".cache" / "wheels")
    ap.add_argument("--out", type=Path, default=REPO / ".whl" / f"sgl_kernel-{VERSION}.tar.xz")
    a = ap.parse_args(argv)
    wheel = fetch(a.cache)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    kept = 0
    with zipfile.ZipFile(wheel) as zf, tarfile.open(a.out, "w:xz") as tar:
        for info in zf.infolist():
            name = info.filename
            if not name.startswith("sgl_kernel/") or info.is_dir() or name.startswith(DROP):
                continue
            data = zf.read(info)
            member = tarfile.TarInfo(name)
            member.size = len(data)
            member.mode = 0o755 if name.endswith(".so") else 0o644
            tar.addfile(member, io.BytesIO(data))
            kept += len(data)
    print(
        f"{a.out}: sgl_kernel {VERSION}, {kept / 2**20:.1f} MiB unpacked, "
        f"{a.out.stat().st_size / 2**20:.1f} MiB packed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
