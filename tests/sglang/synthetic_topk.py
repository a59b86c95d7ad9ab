"""A small stand-in for SGLang's topk module, for fast tests of the probe and the
ledger's scans (no SGLang import): the same names, flags and helpers the real module has
(``_is_hip``, ``_is_cuda``, ``TopKConfig``, ``_mask_topk_ids_padded_region`` with a
``fill_value``, ``_zero_topk_weights_padded_region``, ``_eplb_remap_enabled``,
``topk_ids_logical_to_physical``), written to a file and imported under a private name,
with one ``_post_process_topk_ids`` body per form. The real releases are driven in
``test_releases.py`` and ``test_variants.py``."""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import sys
import types
from pathlib import Path
from typing import Any

from sglang_amd_moe.runtime.sglang import probe

PRELUDE = """
from dataclasses import dataclass
from typing import Optional

import torch



def is_cuda() -> bool:  # this stand-in plays a CUDA machine
    return True


def is_hip() -> bool:
    return False


_is_cuda = is_cuda()
_is_hip = is_hip()


@dataclass
class TopKConfig:
    top_k: int
    num_fused_shared_experts: int = 0


def _eplb_remap_enabled() -> bool:
    return False  # outside a server


def topk_ids_logical_to_physical(topk_ids, info, log2phy_prob=None):
    if info is None:
        return topk_ids
    return info.partial_logical_to_rank_dispatch_physical_map[topk_ids.long()].to(topk_ids.dtype)


def _mask_topk_ids_padded_region(topk_ids, num_token_non_padded=None, fill_value=-1):
    if num_token_non_padded is None:
        return
    rows = torch.arange(topk_ids.shape[0], device=topk_ids.device)
    topk_ids.masked_fill_((rows >= num_token_non_padded)[:, None], fill_value)


def _zero_topk_weights_padded_region(topk_weights, num_token_non_padded=None):
    if num_token_non_padded is None:
        return
    rows = torch.arange(topk_weights.shape[0], device=topk_weights.device)
    topk_weights.masked_fill_((rows >= num_token_non_padded)[:, None], 0.0)

"""

SIGNATURE = """
def _post_process_topk_ids(
    topk_ids,
    topk_weights,
    topk_config,
    router_logits,
    layer_id,
    num_token_non_padded=None,
    expert_location_dispatch_info=None,
):
    if _is_cuda:
        topk_ids = topk_ids_logical_to_physical(topk_ids, expert_location_dispatch_info)
        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded)
"""

RETURN = "    return topk_ids, topk_weights\n"

#: HIP branches by form (appended to SIGNATURE, then RETURN).
BODIES = {
    "fixed": """    elif _is_hip:
        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)
        if _eplb_remap_enabled():
            topk_ids = topk_ids_logical_to_physical(topk_ids, expert_location_dispatch_info)
        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)
""",
    "weights-only": """    elif _is_hip:
        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)
""",
    "no-hip-handling": "",
    "mask-under-eplb-guard": """    elif _is_hip:
        if _eplb_remap_enabled():
            _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)
            topk_ids = topk_ids_logical_to_physical(topk_ids, expert_location_dispatch_info)
        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)
""",
    "inverted-guard": """    elif _is_hip:
        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)
        if not _eplb_remap_enabled():
            topk_ids = topk_ids_logical_to_physical(topk_ids, expert_location_dispatch_info)
        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)
""",
    "double-remap": """    elif _is_hip:
        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)
        if _eplb_remap_enabled():
            topk_ids = topk_ids_logical_to_physical(topk_ids, expert_location_dispatch_info)
            topk_ids = topk_ids_logical_to_physical(topk_ids, expert_location_dispatch_info)
        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)
""",
    "fill-minus-one": """    elif _is_hip:
        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded)
        if _eplb_remap_enabled():
            topk_ids = topk_ids_logical_to_physical(topk_ids, expert_location_dispatch_info)
        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)
""",
    "real-rows-scaled": """    elif _is_hip:
        _mask_topk_ids_padded_region(topk_ids, num_token_non_padded, fill_value=0)
        _zero_topk_weights_padded_region(topk_weights, num_token_non_padded)
        topk_weights = topk_weights * 2
""",
    "raises-systemexit": """    elif _is_hip:
        raise SystemExit(7)
""",
}


def source(form: str, body: str | None = None) -> str:
    """A whole module's text with the function of ``form`` (or a given HIP ``body``)."""
    return PRELUDE + SIGNATURE + (BODIES[form] if body is None else body) + RETURN


_counter = itertools.count()


def load(text: str, directory: Path) -> types.ModuleType:
    """Import ``text`` from a file in ``directory`` as a fresh private module."""
    name = f"_synthetic_topk_{next(_counter)}"
    path = Path(directory) / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # inspect.getsource finds the module's file through it
    spec.loader.exec_module(mod)
    return mod


def probe_module(module: types.ModuleType, **kw: Any) -> probe.ProbeResult:
    """The probe of the module's function under any wrappers, as the hook probes it."""
    return probe.probe(inspect.unwrap(module._post_process_topk_ids), **kw)
