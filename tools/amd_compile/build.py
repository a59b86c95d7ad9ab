"""Turn a captured launch into the compilation Triton would do for a target, and do it.

Why Triton's own binder: a launch compiles to different code depending on how Triton
specializes its runtime arguments (pointer and integer divisibility by 16, integers
equal to 1 turned into constants, on AMD whether a tensor fits in 2 GiB so buffer
instructions can address it). Rather than restate those rules, the gate asks the
installed Triton: the same argument binder and argument packing that
``JITFunction.run`` uses, built for the target's backend instead of the local driver's,
applied to the captured arguments. Meta tensors answer everything the binder asks
(dtype, data-pointer alignment from the storage offset, storage size), so the
signature, constants and attributes are the ones a GPU would compile with.

Those are private Triton interfaces (present in Triton 3.6 and 3.8); where they are
missing the gate stops with a message that names what it needs.

The cache key of a compilation is everything that determines its code: the kernel
(Triton's ``cache_key``, a hash of its source and of every function and global it
uses), the signature, constants and attributes, the launch options (``num_warps``...),
the target, the Triton version and the environment variables Triton says change
compilation.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

import triton
from triton import knobs
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction

from .resources import lds_waves_per_simd, parse_amdgcn, parse_ptxas_log, parse_res_usage
from .targets import Target

try:  # Triton >= 3.6 (the binder JITFunction.run builds for a backend)
    from triton.runtime.jit import create_function_from_signature
except ImportError:  # pragma: no cover - depends on the installed Triton
    create_function_from_signature = None

try:
    from triton._C.libtriton import get_cache_invalidating_env_vars
except ImportError:  # pragma: no cover - depends on the installed Triton
    get_cache_invalidating_env_vars = None


class UnsupportedTriton(RuntimeError):
    """The installed Triton lacks an interface the gate needs."""


def _require_binder(kernel: JITFunction) -> None:
    if create_function_from_signature is None or not hasattr(kernel, "_pack_args"):
        raise UnsupportedTriton(
            f"Triton {triton.__version__} has no create_function_from_signature / "
            "JITFunction._pack_args (the argument binder of Triton 3.6+): the compile "
            "gate cannot derive the signature Triton would compile"
        )


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return repr(value)


@dataclass(frozen=True)
class Spec:
    """One compilation: what Triton is given for a launch on a target."""

    kernel: JITFunction
    target: Target
    signature: dict[str, str]
    constexprs: dict  # Triton's form: {(param index,): value}
    attrs: dict  # Triton's form: {(param index,): [[attr, value], ...]}
    options: Any  # the backend's parsed options
    launch_options: dict[str, Any]  # options passed to the compiler besides constexprs
    meta_options: dict[str, Any]  # of those, what the launch itself set (num_warps...)

    @property
    def name(self) -> str:
        return f"{self.kernel.fn.__module__}.{self.kernel.fn.__qualname__}"

    def describe(self) -> dict[str, Any]:
        """The readable identity of the compilation (what the cache key hashes)."""
        names = self.kernel.arg_names
        return {
            "kernel": self.name,
            "source": self.kernel.cache_key,
            "signature": {k: str(v) for k, v in self.signature.items() if v != "constexpr"},
            "constexprs": {names[p[0]]: _jsonable(v) for p, v in sorted(self.constexprs.items())},
            "attrs": {
                names[p[0]]: _jsonable(v) for p, v in sorted(self.attrs.items()) if len(v) > 0
            },
            "options": {k: _jsonable(v) for k, v in sorted(self.launch_options.items())},
            "target": self.target.label,
            "triton": triton.__version__,
            "env": dict(sorted(get_cache_invalidating_env_vars().items()))
            if get_cache_invalidating_env_vars is not None
            else {},
        }

    def config(self) -> dict[str, Any]:
        """The constants the kernel is compiled with, and the launch's own options."""
        d = self.describe()
        return {**d["constexprs"], **{k: _jsonable(v) for k, v in self.meta_options.items()}}

    def specialization(self) -> str:
        """The runtime arguments' types and attributes, compactly: ``name:type`` plus
        ``/16`` (divisible by 16) and ``/2G`` (within 2 GiB: AMD buffer instructions)."""
        names = self.kernel.arg_names
        parts = []
        for i, name in enumerate(names):
            ty = self.signature.get(name)
            if ty is None or ty == "constexpr":
                continue
            tags = ""
            for attr, value in self.attrs.get((i,), []):
                if attr == "tt.divisibility":
                    tags += f"/{value}"
                elif attr == "tt.pointer_range":
                    tags += "/2G" if value == 32 else f"/range{value}"
                else:
                    tags += f"/{attr}={value}"
            parts.append(f"{name}:{ty}{tags}")
        return " ".join(parts)

    @functools.cached_property
    def key(self) -> str:
        blob = json.dumps(self.describe(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:20]


_BACKENDS: dict[Target, Any] = {}
_BINDERS: dict[tuple[int, Target], Any] = {}
# Specs by what the binder returned: the same key JITFunction.run uses for its own
# in-memory cache (the specialization list and the options), so a launch the binder
# has seen is not packed and hashed again.
_SPECS: dict[tuple[int, Target, str, str], Spec] = {}


def specialize(kernel: Any, args: tuple, meta: dict[str, Any], target: Target) -> Spec:
    """What Triton would compile for ``kernel[grid](*args, **meta)`` on ``target``."""
    if not isinstance(kernel, JITFunction):
        raise TypeError(
            f"{kernel!r} is not a compiled Triton kernel (a JITFunction); run the gate "
            "with TRITON_INTERPRET=0"
        )
    _require_binder(kernel)
    backend = _BACKENDS.get(target)
    if backend is None:
        backend = _BACKENDS[target] = make_backend(target.gpu_target())
    binder = _BINDERS.get((id(kernel), target))
    if binder is None:
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        _BINDERS[(id(kernel), target)] = binder
    # As JITFunction.run does before binding: the debug and instrumentation options.
    kwargs = dict(meta)
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    if hasattr(knobs.compilation, "instrumentation_mode"):
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    bound_args, specialization, bound_options = binder(*args, **kwargs)
    seen = (id(kernel), target, str(specialization), str(sorted(bound_options.items())))
    spec = _SPECS.get(seen)
    if spec is not None:
        return spec
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, kwargs, bound_args, specialization, bound_options
    )
    launch_options = {k: v for k, v in kwargs.items() if k not in kernel.arg_names}
    meta_options = {k: v for k, v in meta.items() if k not in kernel.arg_names}
    spec = _SPECS[seen] = Spec(
        kernel, target, signature, constexprs, attrs, options, launch_options, meta_options
    )
    return spec


def compile_spec(spec: Spec) -> dict[str, int]:
    """Compile ``spec`` with the installed Triton and return its resource use.

    AMD: vgpr, agpr, vgpr_total, sgpr, vgpr_spill, sgpr_spill, scratch, lds_static,
    lds (Triton's launch-time LDS plus the static one), occupancy (the compiler's) and
    waves_per_simd (that, bounded by what the LDS allows). NVIDIA: regs, stack_frame,
    spill_stores, spill_loads, local, shared (Triton's launch-time shared memory) and
    shared_static (what ``cuobjdump`` reports besides, the per-block reservation).
    """
    target = spec.target
    src = ASTSource(spec.kernel, spec.signature, spec.constexprs, spec.attrs)
    ptxas_log = io.StringIO()
    with _ptxas_log_to(ptxas_log) if not target.is_amd else contextlib.nullcontext():
        compiled = triton.compile(src, target=target.gpu_target(), options=spec.options.__dict__)
    md = compiled.metadata
    shared = int(md.shared)
    if target.is_amd:
        res = parse_amdgcn(compiled.asm["amdgcn"])
        res["lds"] = shared + res["lds_static"]
        waves_per_workgroup = int(md.num_warps)
        lds_bound = lds_waves_per_simd(
            res["lds"],
            waves_per_workgroup,
            target.lds_per_cu,
            target.lds_granule,
            target.simds_per_cu,
        )
        res["waves_per_simd"] = min(
            res["occupancy"], lds_bound if lds_bound is not None else res["occupancy"]
        )
        return dict(sorted(res.items()))
    name = md.name
    res = parse_ptxas_log(ptxas_log.getvalue(), name)
    usage = parse_res_usage(_cuobjdump_res_usage(compiled.asm["cubin"]), name)
    if usage["regs"] != res["regs"]:
        raise RuntimeError(f"{name}: ptxas says {res['regs']} registers, cuobjdump {usage['regs']}")
    res["local"] = usage["local"]
    res["shared"] = shared
    res["shared_static"] = usage["shared_static"]
    return dict(sorted(res.items()))


@contextlib.contextmanager
def _ptxas_log_to(buffer: io.StringIO):
    """Triton prints the ``ptxas -v`` log when asked to: capture it."""
    previous = knobs.nvidia.dump_ptxas_log
    knobs.nvidia.dump_ptxas_log = True
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        knobs.nvidia.dump_ptxas_log = previous


def _cuobjdump_res_usage(cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        return subprocess.run(
            [knobs.nvidia.cuobjdump.path, "-res-usage", path],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
