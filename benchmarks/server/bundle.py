"""Build the folder the real-server run carries to the GPU machine (no registry there).

Run here, where pip reaches the registry: ``make server-wheels`` (or ``python
benchmarks/server/bundle.py --dest DIR``). The folder holds

* ``wheels/``: this package built as a wheel from the tree being tested, SGLang
  0.5.13.post1 for Python 3.12, and the smallest set of other wheels its HTTP server,
  scheduler and model runner import on that machine beyond what its image already has
  (torch 2.11.0, triton 3.6.0, numpy, aiohttp, uvloop, ... are there). Two are trimmed
  so the whole folder fits one transfer (SGLang itself is carried whole): files nothing
  on the server's path loads are dropped and the wheel's RECORD rewritten to match (see
  ``TRIMS``), and the largest are stored with LZMA instead of deflate (same members,
  same bytes once unpacked, same RECORD; pip reads either), so the folder and the tree
  the device call sends fit its 64 MiB together;
* ``server/``: ``device.sh``, ``harness.py``, ``site/sitecustomize.py``,
  ``site/topk_counts.py`` and the aiter stand-in under ``site/aiter_server/``;
* ``manifest.json``: every wheel with its size and sha256, what was trimmed and
  recompressed, and the commit of the tree the package wheel was built from.

Downloads are cached in ``.cache/server-wheels/`` (git-ignored) and reused.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LIMIT = 64 * 2**20  # one transfer: the working tree that travels plus carried paths

# Python 3.12 wheels for the GPU machine's interpreter.
PLATFORMS = [
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--platform",
    "manylinux_2_34_x86_64",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_27_x86_64",
    "--platform",
    "manylinux_2_26_x86_64",
    "--platform",
    "manylinux_2_24_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux2014_x86_64",
    "--platform",
    "manylinux1_x86_64",
    "--platform",
    "manylinux_2_5_x86_64",
]

# SGLang 0.5.13.post1 (form `weights-only`; pins torch 2.11.0, the GPU machine's) and
# the compiled kernels it pins.
SGLANG = ["sglang==0.5.13.post1", "sglang-kernel==0.4.3", "flashinfer-python==0.6.12"]
# What its import needs beyond the GPU image, at the versions 0.5.13.post1 resolves to
# (transformers 5.8.1 and tokenizers <= 0.23.0 are pinned by it; the image's newer ones
# are shadowed). IPython is imported (sglang.utils) but none of its optional helpers.
CLOSURE = [
    "transformers==5.8.1",
    "tokenizers==0.22.2",
    "annotated_types==0.8.0",
    "apache_tvm_ffi==0.1.9",
    "compressed_tensors==0.20.1",
    "dill==0.4.1",
    "distro==1.9.0",
    "gguf==0.19.0",
    "ipython==9.18.1",
    "traitlets==5.16.1",
    "jiter==0.19.0",
    "loguru==0.7.3",
    "msgspec==0.23.0",
    "openai==2.6.1",
    "orjson==3.13.0",
    "partial_json_parser==0.2.1.1.post7",
    "pybase64==1.5.1",
    "pydantic==2.14.4",
    "pydantic_core==2.50.5",
    "pyzmq==27.3.0",
    "sniffio==1.3.1",
    "starlette==1.10.0",
    "typing_inspection==0.4.5",
]
# The HTTP server's own imports. fastapi 0.140.0: the newest line that does not require
# opentelemetry-api (0.150 and later do); 0.5.13.post1 pins soundfile 0.13.1.
HTTP = [
    "fastapi==0.140.0",
    "uvicorn==0.54.0",
    "setproctitle==1.3.8",
    "python-multipart==0.0.34",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "soundfile==0.13.1",
    "cffi==2.1.1",
]
PINS = SGLANG + CLOSURE + HTTP

# Dropped from wheels (path prefixes inside the wheel), and why.
TRIMS: dict[str, tuple[tuple[str, ...], str]] = {
    "sglang_kernel": (
        (
            "sgl_kernel/flash_ops.abi3.so",
            "sgl_kernel/flashmla_ops.abi3.so",
            "sgl_kernel/sm100/",
            "lib/",
            "lib64/",
            "include/",
            "_mscclpp",
            "triton_kernels/",
        ),
        "FlashAttention/FlashMLA builds (1.09 GB; Triton attention runs instead), the "
        "Blackwell build of common_ops (the H200 loads sm90/), mscclpp (multi-GPU "
        "all-reduce) and triton_kernels (optional import; the Triton MoE runner is used)",
    ),
    "flashinfer_python": (
        (
            "flashinfer/data/cutlass/",
            "flashinfer/data/cccl/python/",
            "flashinfer/data/cccl/benchmarks/",
            "flashinfer/data/cccl/ci/",
            "flashinfer/data/cccl/docs/",
        ),
        "CUTLASS (its GEMM/attention JIT modules) and CCCL's Python, docs and benchmarks. "
        "Kept: the sources, headers, spdlog and CCCL headers its JIT compiles the norm "
        "module from (sgl_kernel's RMSNorm calls flashinfer's, built with nvcc on first use)",
    ),
}


# Wheels at least this large are rewritten with LZMA (about 2.3 MiB saved on
# sglang-kernel, 1.2 MiB on sglang, 4.4 MiB on the four together).
RECOMPRESS_FROM = 4 * 2**20
SERVER_FILES = (
    "device.sh",
    "harness.py",
    "site/sitecustomize.py",
    "site/topk_counts.py",
    # The aiter stand-in of the guard-only runs (SGLANG_AMD_MOE_TEST_AITER).
    "site/aiter_server/aiter/__init__.py",
    "site/aiter_server/aiter/fused_moe.py",
    "site/aiter_server/aiter/tuned_gemm.py",
    "site/aiter_server/aiter/ops/__init__.py",
    "site/aiter_server/aiter/ops/shuffle.py",
    "site/aiter_server/aiter/ops/flydsl/__init__.py",
    "site/aiter_server/aiter/ops/flydsl/moe_common.py",
)


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def dist_name(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower()


def download(cache: Path) -> list[Path]:
    """The pinned wheels, from the cache or the registry (one pip call for the missing)."""
    cache.mkdir(parents=True, exist_ok=True)

    def find(pin: str) -> Path | None:
        name, version = pin.split("==")
        norm = name.lower().replace("-", "_")
        hits = [
            p
            for p in cache.glob("*.whl")
            if dist_name(p) == norm and p.name.split("-")[1] == version
        ]
        return hits[0] if hits else None

    missing = [pin for pin in PINS if find(pin) is None]
    if missing:
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                *PLATFORMS,
                "-d",
                str(cache),
                *missing,
            ]
        )
    wheels = []
    for pin in PINS:
        path = find(pin)
        if path is None:
            raise SystemExit(f"bundle: {pin} was not downloaded into {cache}")
        wheels.append(path)
    return wheels


def trim_wheel(src: Path, dest: Path, prefixes: tuple[str, ...]) -> dict:
    """Copy ``src`` to ``dest`` without members under ``prefixes``; RECORD lists only what
    is left, so pip installs it as the same distribution, version and files."""
    removed, removed_bytes = [], 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        for info in zin.infolist():
            if info.filename == record_name:
                continue
            if info.filename.startswith(prefixes):
                removed.append(info.filename)
                removed_bytes += info.file_size
                continue
            zout.writestr(info, zin.read(info.filename))
        rows = csv.reader(io.StringIO(zin.read(record_name).decode()))
        kept = [r for r in rows if r and not r[0].startswith(prefixes)]
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(kept)
        zout.writestr(record_name, buf.getvalue())
    return {"removed_files": len(removed), "removed_bytes": removed_bytes}


def recompress_wheel(path: Path) -> dict:
    """Rewrite the wheel at ``path`` with every member stored with LZMA, members, order,
    names, dates and modes unchanged (RECORD hashes the unpacked bytes, so it stays
    valid). Returns the sizes before and after."""
    before = path.stat().st_size
    tmp = path.with_suffix(".lzma.tmp")
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_LZMA) as zout:
        for info in zin.infolist():
            member = zipfile.ZipInfo(info.filename, info.date_time)
            member.external_attr = info.external_attr
            member.compress_type = zipfile.ZIP_LZMA
            zout.writestr(member, zin.read(info.filename))
    tmp.replace(path)
    return {"bytes_deflate": before, "bytes_lzma": path.stat().st_size}


def build_package_wheel(out: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp, str(REPO)])
        built = sorted(Path(tmp).glob("sglang_amd_moe-*.whl"))
        if len(built) != 1:
            raise SystemExit(f"bundle: expected one sglang_amd_moe wheel, got {built}")
        target = out / built[0].name
        shutil.copy2(built[0], target)
    return target


def tree_commit() -> dict:
    def git(*a: str) -> str:
        proc = subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", type=Path, default=REPO / ".carry-server")
    p.add_argument("--cache", type=Path, default=REPO / ".cache" / "server-wheels")
    args = p.parse_args()

    shutil.rmtree(args.dest, ignore_errors=True)
    wheels_dir = args.dest / "wheels"
    wheels_dir.mkdir(parents=True)
    manifest: dict = {"tree": tree_commit(), "wheels": [], "trims": {}, "recompressed": {}}

    package = build_package_wheel(wheels_dir)
    for src in [package, *download(args.cache)]:
        name = dist_name(src)
        target = wheels_dir / src.name
        if name in TRIMS:
            prefixes, why = TRIMS[name]
            info = trim_wheel(src, target, prefixes)
            manifest["trims"][src.name] = {"dropped": list(prefixes), "why": why, **info}
        elif src != target:
            shutil.copy2(src, target)
        if target.stat().st_size >= RECOMPRESS_FROM:
            manifest["recompressed"][target.name] = recompress_wheel(target)
        manifest["wheels"].append(
            {"file": target.name, "bytes": target.stat().st_size, "sha256": sha256(target)}
        )

    server = args.dest / "server"
    (server / "site").mkdir(parents=True)
    for rel in SERVER_FILES:
        (server / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(HERE / rel, server / rel)
    total = sum(f.stat().st_size for f in args.dest.rglob("*") if f.is_file())
    manifest["bytes_total"] = total
    (args.dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"bundle: {len(manifest['wheels'])} wheels, {total / 2**20:.1f} MiB in {args.dest}")
    if total > LIMIT - 4 * 2**20:
        print(
            f"bundle: WARNING: {total / 2**20:.1f} MiB leaves under 4 MiB "
            "of the 64 MiB transfer for the tree"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
