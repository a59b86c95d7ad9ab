"""What an SGLang release's own code says about the padded rows of each MoE path, per model
family: whether a count of real rows reaches ``_post_process_topk_ids``, what the padded
rows hold, and what SGLang itself does about them. Read from the files (an installed
package or a release wheel), never imported; a shape of code this module does not know
reads ``?`` with the reason, never a guess.

The rows are facts about SGLang's code only; who masks what (upstream, the plugin's hook,
its guard, or nothing) also depends on the form of ``_post_process_topk_ids`` and on this
process, and is decided by :mod:`.coverage`.
"""

from __future__ import annotations

import ast
import re
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: The paths, in the order they are printed, and their labels.
PATHS = {
    "tp": "TP MoE, decode graphs",
    "dp": "DP attention, TP MoE",
    "ep": "expert parallel, all-to-all (DeepEP, mori)",
    "prefill-full": "TP prefill graphs (--cuda-graph-backend-prefill full)",
    "eagle": "EAGLE/MTP draft graphs (draft decode, draft-extend)",
    "eagle-multi": "multi-layer EAGLE draft-extend graphs",
    "dspark": "DSpark draft graphs",
}
#: Model families and the model file that decides their MoE calls.
FAMILIES = {
    "deepseek-v3": ("DeepSeek-V3/R1", "srt/models/deepseek_v2.py"),
    "deepseek-v4": ("DeepSeek-V4", "srt/models/deepseek_v4.py"),
    "qwen3-moe": ("Qwen3-MoE", "srt/models/qwen3_moe.py"),
    "glm": ("GLM-4.5/4.6 MoE", "srt/models/glm4_moe.py"),
}
ALL = "all"  # a row that holds for every family
_MOE_OF = {fam: rel for fam, (_, rel) in FAMILIES.items()}

# What the padded rows hold.
VALID = "valid forward passes"
GATHER = "uninitialised gather buffers"
ZEROED = "zeroed before the gather"
RECEIVE = "uninitialised receive-buffer tails"
SENTINEL = "-1 sentinel"
UNKNOWN = "?"

_FBI = "srt/model_executor/forward_batch_info.py"
_TOPK = "srt/layers/moe/topk.py"
_DP = "srt/layers/dp_attention.py"
_DECODE_RUNNERS = ("srt/model_executor/runner/decode_cuda_graph_runner.py",)
_DECODE_RUNNERS += ("srt/model_executor/cuda_graph_runner.py",)
_BUFFERS = ("srt/model_executor/runner/base_runner.py", "srt/model_executor/cuda_graph_runner.py")
_PREFILL = "srt/model_executor/runner/prefill_cuda_graph_runner.py"
_EAGLE = ("srt/speculative/eagle_draft_cuda_graph_runner.py",)
_EAGLE += ("srt/speculative/eagle_draft_extend_cuda_graph_runner.py",)
_EAGLE_MULTI = "srt/speculative/multi_layer_eagle_draft_extend_cuda_graph_runner.py"
_DSPARK = "srt/speculative/dspark_components/dspark_draft.py"
#: Functions of a model's MoE that run only with expert parallelism or another backend.
_NOT_TP = re.compile(r"deepep|select_experts|mega|a2a|tbo", re.I)


@dataclass
class Row:
    """One cell of the coverage table: a path of one release, for one family (or all)."""

    path: str
    family: str
    count: str  # "yes", "no", "?"; "-" where the path does not exist in this release
    count_why: str
    rows: str  # VALID, GATHER, ZEROED, RECEIVE, SENTINEL, "?", "-"
    rows_why: str
    upstream: str = ""  # what SGLang itself does to the padded rows ("" nothing)
    flag: str = ""  # the flag or environment variable that changes this cell
    stale: str = ""  # where the batch holds a count that is not this batch's
    evidence: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


class Tree:
    """The files of one SGLang package (``srt/...`` paths relative to ``sglang/``)."""

    def __init__(self, read: Callable[[str], str | None], where: str) -> None:
        self._read, self.where, self._cache = read, where, {}
        # Parsed once per file: the readers walk the large model files several times.
        # The trees are only read, never changed.
        self._trees: dict[str, ast.Module | None] = {}

    def text(self, rel: str) -> str | None:
        if rel not in self._cache:
            try:
                self._cache[rel] = self._read(rel)
            except (OSError, UnicodeDecodeError, KeyError):
                self._cache[rel] = None
        return self._cache[rel]

    def tree(self, rel: str) -> ast.Module | None:
        if rel not in self._trees:
            text = self.text(rel)
            try:
                self._trees[rel] = ast.parse(text) if text is not None else None
            except SyntaxError:
                self._trees[rel] = None
        return self._trees[rel]


def dir_tree(root: Path) -> Tree:
    """An installed SGLang: ``root`` is the ``sglang`` package folder."""
    from sglang_amd_moe.diagnostics.sources import text_or_none

    return Tree(lambda rel: text_or_none(root / rel), str(root))


def wheel_tree(wheel: Path) -> Tree:
    """An SGLang release wheel, read without unpacking it."""
    zf = zipfile.ZipFile(wheel)
    return Tree(lambda rel: zf.read(f"sglang/{rel}").decode("utf-8"), str(wheel))


def _at(rel: str, node: ast.AST | None) -> str:
    return f"{rel}:{getattr(node, 'lineno', '?')}"


def _functions(tree: ast.Module | None) -> dict[str, ast.FunctionDef]:
    out: dict[str, ast.FunctionDef] = {}
    for n in ast.walk(tree) if tree is not None else ():
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
            out.setdefault(n.name, n)  # type: ignore[arg-type]
    return out


def _calls(node: ast.AST) -> Iterable[str]:
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            yield f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


# --------------------------------------------------------------------------- the gate


@dataclass
class Gate:
    """``enable_num_token_non_padded()``: when a CUDA graph carries a count of real rows."""

    terms: list[str]  # "ep", "world-dp-gather", "custom-a2a", "hip-dp-tp"
    unknown: str = ""  # a condition this reader does not know ("" none)
    at: str = ""
    dp_env: str = ""  # the environment variable of "hip-dp-tp"
    dp_env_default: str = ""

    def on(self, config: str) -> bool:
        """Whether a graph of ``config`` ("tp", "dp", "ep") carries a count on HIP with
        default settings ("world-dp-gather" holds only after an Elastic EP scale-up)."""
        if config == "ep":
            return "ep" in self.terms
        return config == "dp" and "hip-dp-tp" in self.terms


def _gate_term(expr: ast.expr, helpers: dict[str, ast.FunctionDef], gate: Gate) -> None:
    if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or):
        for v in expr.values:
            _gate_term(v, helpers, gate)
        return
    text = ast.unparse(expr)
    if isinstance(expr, ast.Compare) and re.fullmatch(
        r"\S*(ep_size|expert_parallel_world_size\(\))\S* > 1", text
    ):
        gate.terms.append("ep")
    elif text == "world_dp_gather_enabled()":
        gate.terms.append("world-dp-gather")  # Elastic EP's gathers over WORLD only
    elif re.fullmatch(r"get_moe_a2a_backend\(\)\.is_customized\(\)", text):
        gate.terms.append("custom-a2a")
    elif isinstance(expr, ast.Call) and getattr(expr.func, "id", "") in helpers:
        body = ast.unparse(helpers[expr.func.id])  # type: ignore[attr-defined]
        env = re.search(r"get_bool_env_var\(\s*'([A-Z_]+)'(?:,\s*default=)?\s*'?(\w*)", body)
        if env and "_is_hip" in body and "attn_dp_size > 1" in body and "is_none()" in body:
            gate.terms.append("hip-dp-tp")
            gate.dp_env, gate.dp_env_default = env.group(1), env.group(2) or "false"
        else:
            gate.unknown = gate.unknown or text
    else:
        gate.unknown = gate.unknown or text


def read_gate(tree: Tree) -> Gate | None:
    mod = tree.tree(_FBI)
    fns = {n.name: n for n in (mod.body if mod else []) if isinstance(n, ast.FunctionDef)}
    fn = fns.get("enable_num_token_non_padded")
    if fn is None:
        return None
    gate = Gate([], at=_at(_FBI, fn))
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) or isinstance(s, ast.ImportFrom))]
    for s in body:
        if isinstance(s, ast.If) and len(s.body) == 1 and isinstance(s.body[0], ast.Return):
            if ast.unparse(s.body[0]) == "return True" and not s.orelse:
                _gate_term(s.test, fns, gate)
                continue
        if isinstance(s, ast.Return) and s.value is not None:
            _gate_term(s.value, fns, gate)
            continue
        gate.unknown = gate.unknown or ast.unparse(s).splitlines()[0]
    return gate


# --------------------------------------------------------------------------- the pieces


@dataclass
class Reads:
    """Everything read from one release, once."""

    gate: Gate | None
    runner: str  # "always" (capture-time count kept on every path), "gated", "?"
    runner_at: str
    zero_inputs: str  # where the decode graph's input ids start as zeros ("" not found)
    moe_bound: str  # "none-on-dp" where moe_num_token_non_padded() gives none under DP
    moe_bound_at: str
    context: str  # topk.py reads the count from the forward context ("" not)
    dp_empty: str  # where the DP gather buffer is torch.empty ("" not found)
    prefill_full: str  # where FULL prefill graphs register a count ("" none)
    prefill_backend: bool  # the release has prefill graph backends at all
    mori_env: str  # topk.py's SGLANG_MORI_NO_PAD_MASK read ("" none)
    zeroing: dict[str, str]  # family -> where it zeroes DP pad rows
    callers: dict[str, tuple[str, str, str, str]]  # family -> (TP kind, EP kind, wheres)


def _runner(tree: Tree) -> tuple[str, str]:
    """Whether the decode graph's batch always holds the count buffer ("always": written at
    capture, refreshed only where the gate holds) or only where the gate holds ("gated")."""
    for rel in _DECODE_RUNNERS:
        mod = tree.tree(rel)
        if mod is None:
            continue
        kinds = []
        for n in ast.walk(mod):
            for kw in getattr(n, "keywords", None) or []:
                if kw.arg != "num_token_non_padded" or not isinstance(n, ast.Call):
                    continue
                v = kw.value
                if isinstance(v, ast.IfExp) and "enable_num_token_non_padded" in ast.unparse(v):
                    kinds.append(("gated", _at(rel, n)))
                elif isinstance(v, ast.Attribute) and v.attr == "num_token_non_padded":
                    if "buffers" in ast.unparse(v) or "self" in ast.unparse(v):
                        kinds.append(("always", _at(rel, n)))
        if kinds:
            return kinds[0]
        return "?", rel
    return "?", ""


def _zero_inputs(tree: Tree, rels: Iterable[str]) -> str:
    for rel in rels:
        mod = tree.tree(rel)
        for n in ast.walk(mod) if mod is not None else ():
            if (
                isinstance(n, ast.Assign)
                and any(ast.unparse(t) in ("input_ids", "self.input_ids") for t in n.targets)
                and ast.unparse(n.value).startswith("torch.zeros(")
            ):
                return _at(rel, n)
    return ""


def _moe_bound(tree: Tree) -> tuple[str, str]:
    fn = _functions(tree.tree(_FBI)).get("moe_num_token_non_padded")
    if fn is None:
        return "", ""
    for n in ast.walk(fn):
        if isinstance(n, ast.If) and ast.unparse(n.test) == "get_parallel().attn_dp_size != 1":
            if ast.unparse(n.body[0]) == "return None":
                return "none-on-dp", _at(_FBI, n)
    return "?", _at(_FBI, fn)


def _context(tree: Tree) -> str:
    mod = tree.tree(_TOPK)
    for n in ast.walk(mod) if mod is not None else ():
        if isinstance(n, ast.Attribute) and n.attr == "moe_num_token_non_padded":
            if "get_forward_context()" in ast.unparse(n):
                return _at(_TOPK, n)
    return ""


def _dp_empty(tree: Tree) -> str:
    mod = tree.tree(_DP)
    for fn in ast.walk(mod) if mod is not None else ():
        if isinstance(fn, ast.FunctionDef) and fn.name == "get_global_dp_buffer":
            for n in ast.walk(fn):
                if isinstance(n, ast.Call) and ast.unparse(n.func) == "torch.empty":
                    return _at(_DP, n)
    return ""


def _prefill_full(tree: Tree) -> tuple[str, bool]:
    mod = tree.tree(_PREFILL)
    if mod is None:
        return "", False
    has_backends = "Backend.FULL" in (tree.text(_PREFILL) or "")
    for n in ast.walk(mod):
        for kw in getattr(n, "keywords", None) or []:
            if kw.arg == "enable_num_token_non_padded" and isinstance(n, ast.Call):
                text = ast.unparse(kw.value)
                if "Backend.FULL" in text and "enable_num_token_non_padded()" in text:
                    return _at(_PREFILL, n), True
    return "", has_backends


def _mori(tree: Tree) -> str:
    mod = tree.tree(_TOPK)
    for n in mod.body if mod is not None else ():
        if isinstance(n, ast.Assign) and "SGLANG_MORI_NO_PAD_MASK" in ast.unparse(n.value):
            return _at(_TOPK, n)
    return ""


def _zeroing(tree: Tree) -> dict[str, str]:
    """Family -> where its MoE zeroes each rank's pad rows before the DP gather: the model
    file calls ``_mask_dp_pad_rows``, or imports a module whose code calls it."""
    callers: dict[str, str] = {}  # module (dotted) -> call site
    for rel in _model_files(tree):
        if "_mask_dp_pad_rows" not in (tree.text(rel) or ""):
            continue  # no call by that name: the file need not be walked
        mod = tree.tree(rel)
        for n in ast.walk(mod) if mod is not None else ():
            if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "_mask_dp_pad_rows":
                callers.setdefault(rel, _at(rel, n))
    out: dict[str, str] = {}
    if not callers:
        return out
    for fam, (_, rel) in FAMILIES.items():
        if rel in callers:
            out[fam] = callers[rel]
            continue
        mod = tree.tree(rel)
        imported = set()
        for n in ast.walk(mod) if mod is not None else ():
            if isinstance(n, ast.ImportFrom) and n.module:
                imported.add(
                    "srt/" + n.module.removeprefix("sglang.srt.").replace(".", "/") + ".py"
                )
        hit = next((callers[m] for m in sorted(imported) if m in callers), "")
        if hit:
            out[fam] = hit
    return out


def _model_files(tree: Tree) -> list[str]:
    """The model files that can hold the DP pad-row zeroing: each family's file and the
    shared DeepSeek modules it imports (read by name; a package listing is not needed)."""
    files = [rel for _, rel in FAMILIES.values()]
    for _, rel in FAMILIES.values():
        if "sglang.srt.models." not in (tree.text(rel) or ""):
            continue  # imports no model module
        mod = tree.tree(rel)
        for n in ast.walk(mod) if mod is not None else ():
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("sglang.srt.models."):
                files.append(
                    "srt/" + n.module.removeprefix("sglang.srt.").replace(".", "/") + ".py"
                )  # type: ignore[union-attr]
    return list(dict.fromkeys(files))


def _callers(tree: Tree, rel: str) -> tuple[str, str, str, str]:
    """How the family's MoE passes a count to topk: on its TP path ("bounded":
    ``moe_num_token_non_padded()``; "batch": the batch's raw count; "none"; "?": a name
    whose origin is not followed), and on its expert-parallel path; with where each is."""
    text = tree.text(rel) or ""
    if rel != _MOE_OF["deepseek-v3"] and "deepseek_v2.DeepseekV2MoE(" in text:
        rel = _MOE_OF["deepseek-v3"]  # this model's MoE layer is DeepSeek-V2's
    tp, ep, where, ep_where = "none", "none", "", ""
    tp_kinds: dict[str, str] = {}
    mod = tree.tree(rel)
    fns = [f for f in ast.walk(mod) if isinstance(f, ast.FunctionDef)] if mod else []
    for fn in fns:
        for n in ast.walk(fn):
            if not isinstance(n, ast.Call):
                continue
            if ast.unparse(n.func).endswith(".moe_num_token_non_padded"):
                kind = "bounded"
            else:
                kw = next((k for k in n.keywords if k.arg == "num_token_non_padded"), None)
                if kw is None:
                    continue
                value = ast.unparse(kw.value)
                kind = (
                    "bounded"
                    if "moe_num_token_non_padded()" in value
                    else ("batch" if value.endswith("forward_batch.num_token_non_padded") else "?")
                )
            if _NOT_TP.search(fn.name):
                if ep in ("none", "?"):
                    ep, ep_where = kind, _at(rel, n)
            else:
                tp_kinds.setdefault(kind, _at(rel, n))
    for kind in ("bounded", "batch", "?"):
        if kind in tp_kinds:
            tp, where = kind, tp_kinds[kind]
            break
    return tp, ep, where, ep_where


def read(tree: Tree) -> Reads:
    runner, runner_at = _runner(tree)
    bound, bound_at = _moe_bound(tree)
    full, backends = _prefill_full(tree)
    callers = {}
    for fam, (_, rel) in FAMILIES.items():
        if tree.text(rel) is not None:
            callers[fam] = _callers(tree, rel)
    return Reads(
        read_gate(tree), runner, runner_at, _zero_inputs(tree, _BUFFERS), bound, bound_at,
        _context(tree), _dp_empty(tree), full, backends, _mori(tree), _zeroing(tree), callers,
    )  # fmt: skip


# --------------------------------------------------------------------------- the rows


def _tp_count(r: Reads, fam: str, config: str) -> tuple[str, str, list[str]]:
    """(count, why, evidence) for a family's TP-path call in a graph of ``config``."""
    tp, _, where, _ = r.callers[fam]
    if tp == "none" and r.context:
        tp, where = "bounded", r.context  # TopK asks the forward context itself
    gate = r.gate
    assert gate is not None
    carries = gate.on(config)
    if tp == "none":
        return "no", "its TP MoE call passes no count to topk", [where] if where else []
    if tp == "bounded" and config == "dp":
        if r.moe_bound == "none-on-dp":
            why = "moe_num_token_non_padded() gives none on a gathered DP buffer"
            return "no", why, [r.moe_bound_at]
        return "?", "moe_num_token_non_padded() is code this reader does not know", [r.moe_bound_at]
    if config == "dp" and carries:  # a rank's own count over the gathered rows: not a prefix
        why = "the TP call passes a count this reader cannot tie to the gathered buffer"
        return "?", why, [gate.at, where]
    if carries:
        return "yes", "the graph carries a count (enable_num_token_non_padded())", [gate.at, where]
    if r.runner == "gated":
        why = "the graph carries none: enable_num_token_non_padded() is false here"
        return "no", why, [gate.at, r.runner_at, where]
    if r.runner == "always":  # a capture-time count would reach topk: never seen released
        why = "the batch's count holds its capture-time value and the TP call passes it"
        return "?", why, [r.runner_at, where]
    return "?", "the decode graph runner is code this reader does not know", [r.runner_at]


def _stale(r: Reads, config: str) -> str:
    if r.gate is not None and r.runner == "always" and not r.gate.on(config):
        return (
            f"the decode graph's forward_batch.num_token_non_padded holds its capture-time "
            f"value ({r.runner_at}; refreshed only where enable_num_token_non_padded() "
            f"holds, {r.gate.at}); no TP caller passes it to topk"
        )
    return ""


def rows(tree: Tree) -> list[Row]:
    """The coverage rows of the SGLang package ``tree`` (see :data:`PATHS`)."""
    r = read(tree)
    out: list[Row] = []
    fams = [f for f in FAMILIES if f in r.callers]
    if r.gate is None or r.gate.unknown or not fams:
        why = (
            f"enable_num_token_non_padded() has a condition this reader does not know: "
            f"{r.gate.unknown}"
            if r.gate is not None and r.gate.unknown
            else "no enable_num_token_non_padded() in forward_batch_info.py, or no known model"
        )
        return [Row(p, ALL, UNKNOWN, why, UNKNOWN, why, evidence=[r.gate.at] if r.gate else [])
                for p in PATHS]  # fmt: skip
    # TP MoE, decode graphs: padded rows run the model on zero input ids.
    valid_why = (
        f"the decode graph's input ids start as zeros ({r.zero_inputs}) and replay writes "
        "only the real rows: padded rows are ordinary forward passes with in-range ids"
    )
    tp_rows = VALID if r.zero_inputs else UNKNOWN
    tp_rows_why = valid_why if r.zero_inputs else "the decode graph's input buffers are not read"
    counts = {f: _tp_count(r, f, "tp") for f in fams}
    for fam, (c, why, ev) in _collapse(counts).items():
        ev = [e for e in (*ev, r.zero_inputs) if e]
        out.append(Row("tp", fam, c, why, tp_rows, tp_rows_why, stale=_stale(r, "tp"), evidence=ev))
    # DP attention with TP MoE.
    dp_cells = {}
    for fam in fams:
        c, why, ev = _tp_count(r, fam, "dp")
        if fam in r.zeroing and r.gate.on("dp"):
            rows_, rwhy = (
                ZEROED,
                f"each rank's pad rows are zeroed before the gather ({r.zeroing[fam]})",
            )
            up = "zeroes each rank's pad rows before the gather (HIP)"
            flag = f"{r.gate.dp_env}=0 turns the zeroing off" if r.gate.dp_env else ""
            ev = [*ev, r.zeroing[fam], r.gate.at]
        elif r.dp_empty:
            rows_, rwhy, up, flag = (
                GATHER,
                f"the gathered MoE input is torch.empty ({r.dp_empty})",
                "",
                "",
            )
            ev = [*ev, r.dp_empty]
        else:
            rows_, rwhy, up, flag = UNKNOWN, "the DP gather buffer is not read", "", ""
        dp_cells[fam] = (c, why, rows_, rwhy, up, flag, ev)
    for fam, (c, why, rows_, rwhy, up, flag, ev) in _collapse(dp_cells).items():
        out.append(Row("dp", fam, c, why, rows_, rwhy, up, flag, evidence=[e for e in ev if e]))
    # Expert parallel, all-to-all.
    ep_cells = {}
    for fam in fams:
        ep, ep_at = r.callers[fam][1], r.callers[fam][3]
        if ep == "none" and r.context:
            ep, ep_at = "bounded", r.context
        c = "yes" if ep != "none" and r.gate.on("ep") else ("no" if ep == "none" else "?")
        why = (
            "its expert-parallel MoE call passes the local count"
            if c == "yes"
            else ("its expert-parallel call passes none" if c == "no" else "the gate does not hold")
        )
        ep_cells[fam] = (c, why, [r.gate.at, ep_at, r.mori_env])
    mori = (
        f"SGLANG_MORI_NO_PAD_MASK=1 ({r.mori_env}) leaves padded weights unzeroed (ids still 0)"
        if r.mori_env else ""
    )  # fmt: skip
    for fam, (c, why, ev) in _collapse(ep_cells).items():
        rwhy = "rows past the count are the receive buffer's tail, never written this step"
        ev = list(dict.fromkeys(e for e in ev if e))
        out.append(Row("ep", fam, c, why, RECEIVE, rwhy, flag=mori, evidence=ev))
    # TP prefill graphs, --cuda-graph-backend-prefill full.
    if not r.prefill_backend:
        out.append(Row("prefill-full", ALL, "-", "no FULL prefill graph backend", "-", ""))
    else:
        pf = {}
        for fam in fams:
            tp, _, where, _ = r.callers[fam]
            tp = "bounded" if tp == "none" and r.context else tp
            if r.prefill_full and tp != "none":
                c, why = "yes", "FULL prefill graphs register the count even without EP"
                ev = [r.prefill_full, where or r.context]
            elif r.prefill_full:
                c, why, ev = "no", "its TP MoE call passes no count to topk", [r.prefill_full]
            else:
                c, why, ev = "no", "FULL prefill graphs carry no count on TP", [r.gate.at]
            pf[fam] = (c, why, ev)
        for fam, (c, why, ev) in _collapse(pf).items():
            rwhy = "what a FULL prefill graph's padded rows hold is not read"
            flag = "only with --cuda-graph-backend-prefill full (off on HIP by default)"
            out.append(Row("prefill-full", fam, c, why, UNKNOWN, rwhy, flag=flag,
                           evidence=[e for e in ev if e]))  # fmt: skip
    # EAGLE/MTP draft graphs.
    out.append(_eagle(tree))
    out.append(_eagle_multi(tree))
    out.append(_dspark(tree, r))
    return out


def _collapse(cells: dict[str, tuple]) -> dict[str, tuple]:
    """One ``all`` row where every family reads the same (evidence aside)."""
    firsts = {tuple(v[:-1]) if len(v) > 2 else v for v in cells.values()}
    if len(firsts) == 1:
        return {ALL: next(iter(cells.values()))}
    return cells


def _eagle(tree: Tree) -> Row:
    texts = [(rel, tree.text(rel)) for rel in _EAGLE]
    texts = [(rel, t) for rel, t in texts if t is not None]
    if not texts:
        return Row("eagle", ALL, "-", "no EAGLE draft graph runner", "-", "")
    sets = [rel for rel, t in texts if re.search(r"\bnum_token_non_padded\s*=", t)]
    zeros = _zero_inputs(tree, [rel for rel, _ in texts])
    rows_, rwhy = (
        (VALID, f"the draft graph's input ids start as zeros ({zeros})")
        if zeros
        else (UNKNOWN, "the draft graph's input buffers are not read")
    )
    if sets:
        return Row("eagle", ALL, "?", f"{sets[0]} sets a count this reader does not follow",
                   rows_, rwhy, evidence=sets)  # fmt: skip
    todo = [f"{rel}:{t[: t.find('support num_token_non_padded')].count(chr(10)) + 1}"
            for rel, t in texts if "support num_token_non_padded" in t]  # fmt: skip
    why = "the draft graph runners set no count" + (" (a TODO)" if todo else "")
    return Row("eagle", ALL, "no", why, rows_, rwhy, evidence=todo or [r for r, _ in texts])


def _eagle_multi(tree: Tree) -> Row:
    mod = tree.tree(_EAGLE_MULTI)
    if mod is None:
        return Row("eagle-multi", ALL, "-", "no multi-layer EAGLE draft-extend runner", "-", "")
    zeros = _zero_inputs(tree, [_EAGLE_MULTI])
    if not zeros and 'cuda_graph_buffers["input_ids"]' in (tree.text(_EAGLE_MULTI) or ""):
        zeros = _zero_inputs(tree, _BUFFERS)  # the target decode graph's buffers, shared
    rows_, rwhy = (
        (VALID, f"the draft graph's input ids start as zeros ({zeros})")
        if zeros
        else (UNKNOWN, "the draft graph's input buffers are not read")
    )
    for n in ast.walk(mod):
        for kw in getattr(n, "keywords", None) or []:
            if kw.arg == "num_token_non_padded":
                return Row("eagle-multi", ALL, "?", "it sets a count this reader does not follow",
                           rows_, rwhy, evidence=[_at(_EAGLE_MULTI, n)])  # fmt: skip
    cpu = next((n for n in ast.walk(mod) if isinstance(n, ast.keyword)
                and (n.arg or "").endswith("num_token_non_padded_cpu")), None)  # fmt: skip
    why = "no count reaches topk"
    if cpu is not None and "bs" in ast.unparse(cpu.value):
        why += f"; its CPU count counts padded rows as real ({cpu.arg}={ast.unparse(cpu.value)})"
    return Row("eagle-multi", ALL, "no", why, rows_, rwhy,
               evidence=[_at(_EAGLE_MULTI, cpu)] if cpu is not None else [])  # fmt: skip


def _dspark(tree: Tree, r: Reads) -> Row:
    text = tree.text(_DSPARK)
    if text is None:
        return Row("dspark", ALL, "-", "no DSpark drafts", "-", "")
    rwhy = "what a DSpark draft graph's padded rows hold is not read"
    if "enable_num_token_non_padded()" in text and "num_token_non_padded" in text:
        line = text[: text.find("enable_num_token_non_padded()")].count("\n") + 1
        gate = r.gate
        on = " or ".join(t for t in (gate.terms if gate else []) if t != "world-dp-gather")
        why = f"a count where enable_num_token_non_padded() holds ({on}); none on plain TP"
        return Row("dspark", ALL, "yes (EP)", why, UNKNOWN, rwhy, evidence=[f"{_DSPARK}:{line}"])
    return Row("dspark", ALL, "no", "the DSpark draft sets no count", UNKNOWN, rwhy,
               evidence=[_DSPARK])  # fmt: skip
