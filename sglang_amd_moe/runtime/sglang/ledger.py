"""What ``topk.py``'s text says without running it, from one parse per file and process.

The fingerprint of ``_post_process_topk_ids``: its definition and the module-level code it
uses, and, transitively, every helper that code reaches by name, in ``topk.py`` and in the
other SGLang modules it imports from (read as files from the SGLang package beside
``topk.py``, never imported), as an AST without comments, docstrings, annotations or layout,
hashed. A name the body uses that its module binds more than once, or writes by other means
(``globals()``, ``setattr`` on the module, ``sys.modules[...]``, ``global`` in a function),
makes the body unknown whatever its fingerprint. The ledger (``ledger.json``, generated from
the real wheels) maps the fingerprint of every released body and of every shipped patch's
result to its form and the hook's plan. Besides, the scans the probe needs: the module's HIP
flags, its EPLB predicates, whether a HIP path calls the remap.
"""

from __future__ import annotations

import ast
import bisect
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_amd_moe.runtime.sglang import names
from sglang_amd_moe.runtime.target import call_name

LEDGER_FILE = Path(__file__).with_name("ledger.json")
# Fields that do not change what code does: left out of the fingerprint.
_IGNORED_FIELDS = frozenset({"ctx", "type_comment", "type_params", "kind", "annotation", "returns"})
#: The top-level package whose modules the fingerprint follows (others are libraries: their
#: import statement is covered, not their code).
PACKAGE = names.TOPK_MODULE.split(".")[0]

#: Where SGLang modules' text comes from: dotted name -> (text, is a package), None when
#: there is no such module. :func:`package_modules` reads an installed package's files.
Modules = Callable[[str], "tuple[str, bool] | None"]


@dataclass(frozen=True)
class Entry:
    form: str
    plan: dict[str, Any] | None  # the hook's plan (``Plan`` fields; None: nothing to hook)
    sources: tuple[str, ...]  # ``sglang 0.5.13``, ``sglang 0.5.12 + <patch>``
    local: str = ""  # the fingerprint of its topk.py part alone (see ``Reading.helpers_read``)


@dataclass(frozen=True)
class Reading:
    """One parse of topk.py (or of a running function with its module's text)."""

    fingerprint: str = ""  # sha256 of the normalised body ("": no plain def bound)
    binding: str = "absent"  # "" (one plain top-level def), "absent", or what it is instead
    lineno: int = 0
    known: Entry | None = None
    hip_flags: tuple[str, ...] = (names.HIP_FLAG,)
    predicates: tuple[str, ...] = names.REMAP_PREDICATES
    remaps_on_hip: bool = False  # a non-CUDA path (or a helper it calls) calls the remap
    node: ast.AST | None = field(default=None, repr=False, compare=False)  # the function (audit)
    #: Why the body cannot be trusted whatever its fingerprint: a name it uses is written
    #: other than by a statement of its module (``globals()``, ``setattr`` on the module,
    #: ``sys.modules[...]``, a ``global`` in a function) ("": nothing such seen).
    rebound: str = ""
    #: A name it uses that its module binds by more than one statement (each of them is in
    #: the fingerprint, so only a body the ledger was generated from reads as known).
    bound_again: str = ""
    #: ``module.name`` of every helper outside topk.py the fingerprint covers.
    helpers: tuple[str, ...] = field(default=(), compare=False)
    #: False when no SGLang package was given to read the helpers from (a text alone, a
    #: loose copy of topk.py): the fingerprint then covers topk.py's part only, and the
    #: ledger answers for the bodies whose topk.py part that is, if they all agree.
    helpers_read: bool = True
    local: str = ""  # the fingerprint of the topk.py part alone

    @property
    def form(self) -> str:
        if self.binding == "absent":
            return "absent"
        return self.known.form if self.known is not None else "unknown"

    @property
    def why(self) -> str:
        if self.binding == "absent":
            return f"no {names.FUNCTION_NAME} bound in topk.py"
        if self.known is not None:
            partly = "" if self.helpers_read else NOT_READ
            return f"the ledger knows this body ({', '.join(self.known.sources[:3])}){partly}"
        what = self.binding or self.rebound or self.bound_again or "a changed body"
        partly = "" if self.helpers_read or self.binding else NOT_READ
        return f"the ledger does not know this body ({what}){partly}"


@functools.cache
def _document() -> dict[str, Any]:
    return json.loads(LEDGER_FILE.read_text(encoding="utf-8"))


@functools.cache
def entries() -> dict[str, Entry]:
    """The ledger: fingerprint -> entry."""
    doc = _document()["entries"]
    return {
        fp: Entry(e["form"], e["plan"], tuple(e["sources"]), e.get("local", ""))
        for fp, e in doc.items()
    }


def by_local() -> dict[str, Entry]:
    """The ledger by the fingerprint of topk.py's part alone: an entry where every body
    with that part has one form and plan (their sources together). An entry without one
    is keyed by its fingerprint (a ledger written before fingerprints read the helpers)."""
    groups: dict[str, list[Entry]] = {}
    for fp, e in entries().items():
        groups.setdefault(e.local or fp, []).append(e)
    out = {}
    for local, es in groups.items():
        if len({(e.form, json.dumps(e.plan, sort_keys=True)) for e in es}) == 1:
            sources = tuple(s for e in es for s in e.sources)
            out[local] = Entry(es[0].form, es[0].plan, sources, local)
    return out


def read(
    module_text: str,
    function_source: str | None = None,
    first_line: int = 1,
    *,
    modules: Modules | str | os.PathLike[str] | None = None,
) -> Reading:
    """Read ``module_text`` (topk.py); with ``function_source`` (``inspect.getsource`` of
    the running function), that function in its module's context instead of the one the
    module binds. ``modules``: where the other SGLang modules are read from, a
    :data:`Modules` or the path of the installed topk.py the text is from (the package
    around it; see :func:`package_modules`). Without one (or for a path outside an SGLang
    package) the helpers in other modules are not read: ``helpers_read`` is False and the
    ledger answers by topk.py's part alone, so code that decides must give the path.
    Never raises: a text that does not parse reads as an unknown body."""
    try:
        tree = _parse(module_text)
        fn_tree = ast.parse(textwrap.dedent(function_source)) if function_source else None
    except (SyntaxError, ValueError) as exc:
        return Reading(binding=f"it does not parse ({exc})")
    top = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    common: dict[str, Any] = {"hip_flags": hip_flags(tree)}
    if function_source is not None:
        fn = fn_tree.body[0] if fn_tree is not None and fn_tree.body else None
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            return Reading(binding="the running object is not a function", **common)
        binding, lineno = "", first_line
    else:
        binding, fn = _binding(tree, module_text)
        if fn is None:
            return Reading(binding=binding, **common)
        lineno = fn.lineno
    used = _used_statements(tree, fn)
    try:
        cover = _covered(module_text, function_source, tree, fn, modules)
    except RecursionError:  # a pathological text: no fingerprint, never a known one
        return Reading(binding="it is nested too deeply to read", **common)
    except Exception as exc:  # a text this reader does not expect: unknown, never known
        return Reading(binding=f"it could not be read ({type(exc).__name__}: {exc})", **common)
    fingerprint = cover.fingerprint if cover.full else cover.local
    table = entries() if cover.full else by_local()
    known = table.get(fingerprint) if not (binding or cover.rebound) else None
    remaps = _remaps(fn, top, set())
    return Reading(fingerprint, binding, lineno, known, predicates=predicates(used),
                   remaps_on_hip=remaps, node=fn, rebound=cover.rebound,
                   bound_again=cover.bound_again, helpers=cover.helpers,
                   helpers_read=cover.full, local=cover.local, **common)  # fmt: skip


def built() -> str:
    """When the ledger was generated (an ISO date; "" for a ledger without one)."""
    return str(_document().get("built", ""))


def releases() -> tuple[str, ...]:
    """The SGLang versions the ledger was generated from."""
    listed = _document().get("releases")
    if listed:
        return tuple(listed)
    out = {s.split()[1] for e in entries().values() for s in e.sources if s.startswith("sglang ")}
    return tuple(sorted(out))


def newer_than_ledger(version: str | None = None) -> str:
    """Empty, or, when ``version`` (default: the installed SGLang distribution's) is later than
    every release the ledger was generated from, the words for it. For messages only: what
    the plugin does never depends on a version string."""
    import importlib.metadata

    try:
        from packaging.version import Version  # SGLang's dependencies bring it

        version = version or importlib.metadata.version(PACKAGE)
        mine = Version(version)
        newest = max((Version(v) for v in releases()), default=None)
    except (ImportError, ValueError, OSError):  # InvalidVersion is a ValueError
        return ""
    if newest is None or mine <= newest:
        return ""
    return f"sglang {version} is newer than this plugin's ledger (built {built() or 'undated'})"


# --- where the other SGLang modules are read from ------------------------------------------


def package_modules(topk_path: str | os.PathLike[str]) -> Modules:
    """The modules of the SGLang package ``topk_path`` (``.../sglang/srt/layers/moe/topk.py``)
    belongs to, read as files (none for a path outside such a package)."""
    return functools.partial(_package_module, _package_root(topk_path))


def _package_root(topk_path: str | os.PathLike[str] | None) -> Path | None:
    """The folder holding the ``sglang`` package ``topk_path`` is in (None: not in one)."""
    if topk_path is None:
        return None
    parts = names.TOPK_MODULE.split(".")
    p = Path(topk_path)
    dirs = [d.name for d in p.parents[: len(parts) - 1]]
    if p.name == parts[-1] + ".py" and dirs == parts[-2::-1]:
        return p.parents[len(parts) - 1]
    return None


def _package_module(root: Path | None, name: str) -> tuple[str, bool] | None:
    if root is None or not name or name.split(".")[0] != PACKAGE:
        return None
    base = root.joinpath(*name.split("."))
    for path, is_package in ((base / "__init__.py", True), (base.with_suffix(".py"), False)):
        try:
            st = path.stat()
        except (OSError, ValueError):
            continue
        text = _file_text(str(path), st.st_mtime_ns, st.st_size)
        if text is not None:
            return text, is_package
    return None


@functools.lru_cache(maxsize=256)
def _file_text(path: str, _mtime_ns: int, _size: int) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


# --- the cover's result, kept on disk ------------------------------------------------------
#: Reading the helpers parses tens of modules (0.1-0.5 s for SGLang 0.5.23 on a 2-core
#: machine); a process that starts again on the same files reads the result back instead.
#: An entry holds the state (path, mtime, size) of every module file the cover looked
#: for, and is used only while all of them are as they were.


@dataclass(frozen=True)
class _Result:
    fingerprint: str
    rebound: str
    bound_again: str
    helpers: tuple[str, ...]
    local: str = ""
    full: bool = True  # the helpers in other modules were read


def _covered(
    text: str, function_source: str | None, tree: ast.Module, fn: ast.AST, modules: Any
) -> _Result:
    if callable(modules):
        return _compute(tree, fn, modules)
    root = _package_root(modules)
    if root is None:  # no package to read the helpers from: topk.py's part only
        return dataclasses.replace(_compute(tree, fn, lambda _: None), full=False)
    looked: dict[str, list[Any] | None] = {}

    def recording(name: str) -> tuple[str, bool] | None:
        looked[name] = _file_state(root, name)
        return _package_module(root, name)

    key = hashlib.sha256(
        "\0".join([_code_version(), str(root), text, function_source or ""]).encode()
    ).hexdigest()
    cached = _cache_get(key, root)
    if cached is not None:
        return cached
    result = _compute(tree, fn, recording)
    _cache_put(key, looked, result)
    return result


def _compute(tree: ast.Module, fn: ast.AST, modules: Modules) -> _Result:
    c = _Cover(tree, fn, modules)
    fp, local = (hashlib.sha256("\n".join(p).encode()).hexdigest() for p in (c.parts, c.local))
    return _Result(fp, c.rebound, c.bound_again, c.helpers, local)


def _file_state(root: Path | None, name: str) -> list[Any] | None:
    """(path, mtime_ns, size) of the file module ``name`` is read from (None: none)."""
    if root is None or name.split(".")[0] != PACKAGE:
        return None
    base = root.joinpath(*name.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        try:
            st = path.stat()
        except (OSError, ValueError):
            continue
        return [str(path), st.st_mtime_ns, st.st_size]
    return None


def _cache_file(key: str) -> Path | None:
    try:
        from sglang_amd_moe.runtime.sglang.verdict import cache_dir

        return cache_dir() / "fingerprints" / f"{key}.json"
    except Exception:  # no cache: the cover is computed every time
        return None


def _cache_get(key: str, root: Path | None) -> _Result | None:
    path = _cache_file(key)
    try:
        doc = json.loads(path.read_text(encoding="utf-8")) if path is not None else None
        if not isinstance(doc, dict) or any(
            _file_state(root, name) != state for name, state in doc["looked"].items()
        ):
            return None
        return _Result(doc["fingerprint"], doc["rebound"], doc["bound_again"],
                       tuple(doc["helpers"]), doc["local"])  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # absent, unreadable or another layout: computed again and rewritten


def _cache_put(key: str, looked: dict[str, Any], result: _Result) -> None:
    import tempfile  # only when a result is written

    path = _cache_file(key)
    if path is None:
        return
    doc = {"looked": looked, **dataclasses.asdict(result)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, prefix=".tmp-", suffix=".json", delete=False
        ) as f:
            json.dump(doc, f)
        os.replace(f.name, path)
    except OSError:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(f.name)


@functools.cache
def _code_version() -> str:
    """This module's own text: a result written by another version of the cover is not
    used."""
    try:
        return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    except OSError:
        return "unknown"


NOT_READ = "; its helpers in other modules were not read (no SGLang package beside it)"


# --- what the fingerprint covers -----------------------------------------------------------


class _Module:
    """One module's parse, and what the cover found in it."""

    def __init__(self, name: str, text: str, package: bool, tree: ast.Module | None = None) -> None:
        self.name, self.package = name, package
        self.facts = _facts(name, package, text, tree)
        self.tree, self.binders, self.stars = self.facts.tree, self.facts.binders, self.facts.stars
        self.needed: set[str] = set()
        self.covered: set[int] = set()
        self.modules: dict[str, str] = {}  # local name -> the SGLang module it is bound to
        self.attrs: set[tuple[str, str]] = set()  # (name, attribute) read in covered code

    def resolve(self, module: str | None, level: int) -> str:
        return _resolve(self.name, self.package, module, level)


class _Cover:
    """The statements the function reaches by name, in topk.py and the SGLang modules it
    imports from (transitively), as canonical text in a fixed order (``parts``), and the
    first write of a name it uses other than by a statement of its module (``rebound``),
    and the first name it uses that is bound by more than one statement (``bound_again``)."""

    def __init__(self, tree: ast.Module, fn: ast.AST, modules: Modules) -> None:
        self._find = modules
        self._mods: dict[str, _Module | None] = {}
        root = _Module(names.TOPK_MODULE, "", False, tree)
        self._mods[root.name] = root
        self._skip = {i for i, s in enumerate(tree.body) if s is fn}
        self._parts: dict[tuple[str, int, str], str] = {}
        self._queue: list[tuple[str, str]] = []
        self._need(root, _free(fn))
        self._scan_imports(root, fn)
        root.attrs |= _attr_loads(fn)
        while self._queue:
            mod_name, name = self._queue.pop()
            self._cover(mod_name, name)
            if not self._queue:
                self._attribute_uses()
        self._parts[(root.name, -1, "")] = _canon(fn)
        seen = [m for m in self._mods.values() if m is not None]
        self.helpers = tuple(sorted(
            f"{m.name}.{n}" for m in seen if m is not root for n in m.needed if n in m.binders
        ))  # fmt: skip
        rebinds = [(why, m, line) for m in seen for why, line in _rebinds(m, self._mods, root)]
        self.rebound = rebinds[0][0] if rebinds else ""
        for _, m, line in rebinds:  # what rebinds is part of the body: two rebindings differ
            i = _top_statement(m.tree, line)
            self._parts[(m.name, i, "")] = _canon(m.tree.body[i])
        self.parts = [self._parts[k] for k in sorted(self._parts, key=_order)]
        # topk.py's part: the same whether or not the other modules could be read
        self.local = [self._parts[k] for k in sorted(self._parts, key=_order) if k[0] == root.name]
        self.bound_again = next((why for m in seen for why in _bound_again(m, root)), "")

    def _module(self, name: str) -> _Module | None:
        if name not in self._mods:
            found = self._find(name)
            mod = None
            if found is not None:
                try:
                    mod = _Module(name, found[0], found[1])
                except (SyntaxError, ValueError):
                    self._parts[(name, -2, "")] = f"(unparsable {name})"
            self._mods[name] = mod
        return self._mods[name]

    def _need(self, mod: _Module, wanted: set[str]) -> None:
        for n in wanted - mod.needed:
            mod.needed.add(n)
            self._queue.append((mod.name, n))

    def _cover(self, mod_name: str, name: str) -> None:
        mod = self._mods[mod_name]
        if mod is None:
            return
        found = [
            i
            for i in mod.binders.get(name, [])
            if i not in self._skip or mod_name != names.TOPK_MODULE
        ]
        if not found and mod.stars:  # maybe from a star import: follow every one
            found = list(mod.stars)
        for i in found:
            s = mod.tree.body[i]
            imports = [
                x for x in _module_statements([s]) if isinstance(x, ast.Import | ast.ImportFrom)
            ]
            if s in imports:  # one top-level import: only the alias that binds the name
                for a in s.names:
                    if (a.asname or a.name).split(".")[0] == name or a.name == "*":
                        one = (
                            ast.ImportFrom(s.module, [a], s.level)
                            if isinstance(s, ast.ImportFrom)
                            else ast.Import([a])
                        )
                        self._parts[(mod.name, i, a.asname or a.name)] = _canon(one)
                        self._follow(mod, s, a, name)
                continue
            if i not in mod.covered:
                mod.covered.add(i)
                self._parts[(mod.name, i, "")] = _canon(s)
                self._need(mod, _free(s))
                mod.attrs |= _attr_loads(s)
                self._scan_imports(mod, s)
            for x in imports:
                for a in x.names:
                    if (a.asname or a.name).split(".")[0] == name or a.name == "*":
                        self._follow(mod, x, a, name)

    def _scan_imports(self, mod: _Module, node: ast.AST) -> None:
        """Imports inside functions (they run when called): every name they bind is used.
        Not inside classes: as for their other names, methods are covered as text."""
        at_import = (
            {id(x) for x in _module_statements([node])} if isinstance(node, ast.stmt) else set()
        )
        stack = [node]
        while stack:
            x = stack.pop()
            if isinstance(x, ast.ClassDef):
                continue
            if isinstance(x, ast.Import | ast.ImportFrom) and id(x) not in at_import:
                for a in x.names:
                    self._follow(mod, x, a, (a.asname or a.name).split(".")[0])
            stack.extend(ast.iter_child_nodes(x))

    def _follow(
        self, mod: _Module, stmt: ast.Import | ast.ImportFrom, alias: ast.alias, name: str
    ) -> None:
        if isinstance(stmt, ast.Import):
            if alias.asname and alias.name.split(".")[0] == PACKAGE and self._module(alias.name):
                mod.modules[alias.asname] = alias.name
            return
        source = mod.resolve(stmt.module, stmt.level)
        if source.split(".")[0] != PACKAGE:
            return  # a library: its import statement is covered, its code is not
        target = self._module(source)
        if target is None:
            self._parts[(source, -2, "")] = f"(no module {source})"
            return
        if alias.name == "*":
            self._need(target, {name})
        elif alias.name in target.binders or (
            target.stars and not self._module(f"{source}.{alias.name}")
        ):
            self._need(target, {alias.name})
        elif self._module(f"{source}.{alias.name}") is not None:
            mod.modules[alias.asname or alias.name] = f"{source}.{alias.name}"
        else:
            self._parts[(source, -2, alias.name)] = f"(no {alias.name} in {source})"

    def _attribute_uses(self) -> None:
        """``m.f`` where ``m`` is an SGLang module: ``f`` of that module is used."""
        for mod in [m for m in self._mods.values() if m is not None]:
            for local, attr in sorted(mod.attrs):
                target_name = mod.modules.get(local)
                target = self._module(target_name) if target_name else None
                if target is not None:
                    self._need(target, {attr})


def _top_statement(tree: ast.Module, line: int) -> int:
    """The index of the top-level statement of ``tree`` that holds ``line``."""
    starts = [min([s.lineno, *(d.lineno for d in getattr(s, "decorator_list", []))])
              for s in tree.body]  # fmt: skip
    return max(bisect.bisect_right(starts, line) - 1, 0)


def _order(key: tuple[str, int, str]) -> tuple[int, str, int, str]:
    return (0 if key[0] == names.TOPK_MODULE else 1, key[0], key[1], key[2])


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp,
           ast.SetComp, ast.DictComp, ast.GeneratorExp)  # fmt: skip


def _free(node: ast.AST) -> set[str]:
    """Module-level names ``node`` (a module-level statement) reads when it runs or when
    the functions it defines run: their free names, annotations left out. A class
    contributes what its body runs at definition (bases, decorators, class-level code),
    not its methods' names: its text is covered, the objects its methods reach are not
    followed (they are found through instances, which a reading cannot resolve)."""
    if isinstance(node, ast.ClassDef):
        outer = [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]
        inner = [s for s in node.body if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)]
        methods = [s for s in node.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)]
        out = set().union(*(_free(x) for x in [*outer, *inner]))
        for m in methods:  # their decorators and defaults run with the class body
            out |= set().union(*(_free(x) for x in _outer_parts(m)))
        return out
    if isinstance(node, _SCOPES):
        return _scope_free(node)
    loads, _ = _scope_names([node])
    return loads


def _outer_parts(fn: ast.AST) -> list[ast.AST]:
    """What a function or lambda evaluates where it is defined."""
    args = fn.args
    outer: list[ast.AST] = [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
    return [*getattr(fn, "decorator_list", []), *outer]


def _scope_free(node: ast.AST) -> set[str]:
    """Free names of a function, lambda, class body or comprehension (the ones it reads
    from its module), including those of scopes nested in it."""
    if isinstance(node, ast.ClassDef):
        return _free(node)
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        a = node.args
        params = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
        params |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
        body = node.body if isinstance(node.body, list) else [node.body]
        loads, stores = _scope_names(body)
        globals_ = {
            n for b in body for x in _walk_scope(b) if isinstance(x, ast.Global) for n in x.names
        }
        outer = set().union(*(_free(x) for x in _outer_parts(node)))
        return outer | (loads - ((params | stores) - globals_))
    # a comprehension: its targets are its own; the first iterable runs outside
    gens = node.generators
    elts = [getattr(node, f) for f in ("elt", "key", "value") if hasattr(node, f)]
    loads, stores = _scope_names([*elts, *(x for g in gens for x in [g.target, *g.ifs])])
    later, later_stores = _scope_names([g.iter for g in gens[1:]])
    first, _ = _scope_names([gens[0].iter]) if gens else (set(), set())
    return first | ((loads | later) - stores - later_stores)


def _walk_scope(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and what it contains, not descending into nested scopes (yielded)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if n is not node and isinstance(n, _SCOPES):
            continue
        for f, v in ast.iter_fields(n):
            if f in ("annotation", "returns"):
                continue
            stack.extend(x for x in (v if isinstance(v, list) else [v]) if isinstance(x, ast.AST))


def _scope_names(nodes: list[ast.AST]) -> tuple[set[str], set[str]]:
    """(free names read, names bound) in ``nodes``, one scope deep; nested scopes add
    their free names to those read."""
    loads: set[str] = set()
    stores: set[str] = set()
    for top in nodes:
        for n in _walk_scope(top):
            if n is not top and isinstance(n, _SCOPES):
                loads |= _scope_free(n)
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    stores.add(n.name)
            elif n is top and isinstance(n, _SCOPES):
                loads |= _scope_free(n)
            elif isinstance(n, ast.Name):
                (loads if isinstance(n.ctx, ast.Load) else stores).add(n.id)
            elif isinstance(n, ast.Import | ast.ImportFrom):
                stores |= {(a.asname or a.name).split(".")[0] for a in n.names}
            elif isinstance(n, ast.ExceptHandler) and n.name:
                stores.add(n.name)
    return loads, stores


def _attr_loads(node: ast.AST) -> set[tuple[str, str]]:
    return {
        (n.value.id, n.attr)
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
    }


_WRITERS = frozenset({"update", "__setitem__", "__delitem__", "setdefault", "pop", "clear"})
#: Text that may start an expression-level write of a module's names; statements on other
#: lines are not walked for them (a whole-module walk costs more than the rest of a read).
_TRIGGERS = re.compile(r"\b(?:globals|vars|setattr|delattr)\s*\(|\bsys\s*\.\s*modules\b")


@dataclass
class _Facts:
    """What one module's text says, whoever reads it: its parse, which top-level
    statements bind each name, its star imports, and every write that could rebind a
    module's names other than by a plain binding."""

    tree: ast.Module
    binders: dict[str, list[int]] = field(default_factory=dict)
    stars: list[int] = field(default_factory=list)
    declared_global: list[tuple[str, int]] = field(default_factory=list)
    #: (target, key, line): target ("self",), ("name", local) or ("module", dotted);
    #: key the name written (None: computed).
    writes: list[tuple[tuple[str, str], str | None, int]] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)  # local -> module, when it holds one


@functools.lru_cache(maxsize=64)
def _facts(name: str, package: bool, text: str, tree: ast.Module | None = None) -> _Facts:
    tree = tree if tree is not None else ast.parse(text)
    f = _Facts(tree)
    for i, s in enumerate(tree.body):
        for x in _module_statements([s]):
            if isinstance(x, ast.ImportFrom) and any(a.name == "*" for a in x.names):
                f.stars.append(i)
            for n in _bound(x):
                if i not in f.binders.setdefault(n, []):
                    f.binders[n].append(i)
    lines = {text.count("\n", 0, m.start()) + 1 for m in _TRIGGERS.finditer(text)} if text else None
    resolve = functools.partial(_resolve, name, package)
    for st in _all_statements(tree.body):
        _statement_writes(st, f, resolve, name, lines)
    return f


def _resolve(name: str, package: bool, module: str | None, level: int) -> str:
    """The absolute name of ``from <level dots><module> import ...`` in module ``name``."""
    if not level:
        return module or ""
    base = name.split(".")
    base = base[: len(base) - level + (1 if package else 0)]
    return ".".join([*base, module] if module else base)


def _all_statements(stmts: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement, at any depth (function and class bodies included)."""
    for s in stmts:
        yield s
        for fname in ("body", "orelse", "finalbody"):
            yield from _all_statements(getattr(s, fname, []) or [])
        for h in getattr(s, "handlers", []) or []:
            yield from _all_statements(h.body)
        for c in getattr(s, "cases", []) or []:
            yield from _all_statements(c.body)


def _header(st: ast.stmt) -> Iterator[ast.AST]:
    """A statement's own expressions (a compound one's nested statements left out)."""
    for fname, v in ast.iter_fields(st):
        if fname in ("body", "orelse", "finalbody", "handlers", "cases"):
            continue
        yield from (x for x in (v if isinstance(v, list) else [v]) if isinstance(x, ast.AST))


def _statement_writes(st: ast.stmt, f: _Facts, resolve: Any, name: str, lines: Any) -> None:
    if isinstance(st, ast.Global):
        f.declared_global.extend((n, st.lineno) for n in st.names)
        return
    if isinstance(st, ast.Import | ast.ImportFrom):
        for a in st.names:
            if isinstance(st, ast.Import) and a.asname:
                f.aliases[a.asname] = a.name
            elif isinstance(st, ast.ImportFrom) and a.name != "*":
                f.aliases.setdefault(a.asname or a.name, f"{resolve(st.module, st.level)}.{a.name}")
        return
    targets: list[ast.AST] = []
    if isinstance(st, ast.Assign | ast.Delete):
        targets = list(st.targets)
    elif isinstance(st, ast.AugAssign | ast.AnnAssign | ast.For | ast.AsyncFor):
        targets = [st.target]
    elif isinstance(st, ast.With | ast.AsyncWith):
        targets = [i.optional_vars for i in st.items if i.optional_vars is not None]
    if isinstance(st, ast.Assign) and (ref := _module_ref(st.value, name)) is not None:
        f.aliases.update({t.id: ref for t in st.targets if isinstance(t, ast.Name)})
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Attribute) and not isinstance(n.ctx, ast.Load):
                spec = _target_spec(n.value, name)
                if spec is not None:
                    f.writes.append((spec, n.attr, st.lineno))
            elif isinstance(n, ast.Subscript) and _is_namespace(n.value):
                f.writes.append((("self", name), _constant(n.slice), st.lineno))
    end = getattr(st, "end_lineno", st.lineno) or st.lineno
    if lines is not None and not any(ln in lines for ln in range(st.lineno, end + 1)):
        return  # nothing on its lines can write a module's names by a call
    for top in _header(st):
        for n in ast.walk(top):
            if not isinstance(n, ast.Call):
                continue
            fn = n.func
            if isinstance(fn, ast.Attribute) and _is_namespace(fn.value) and fn.attr in _WRITERS:
                key = _constant(n.args[0]) if n.args and fn.attr != "update" else None
                f.writes.append((("self", name), key, n.lineno))
            elif call_name(n) in ("setattr", "delattr") and n.args:
                spec = _target_spec(n.args[0], name)
                if spec is not None:
                    key = _constant(n.args[1]) if len(n.args) > 1 else None
                    f.writes.append((spec, key, n.lineno))


def _target_spec(node: ast.AST, name: str) -> tuple[str, str] | None:
    ref = _module_ref(node, name)
    if ref is not None:
        return ("module", ref)
    if isinstance(node, ast.Name):
        return ("name", node.id)
    return None


def _is_namespace(node: ast.AST) -> bool:
    """``globals()`` / ``vars()`` without arguments: the module's own namespace."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("globals", "vars")
        and not node.args
    )


def _bound_again(mod: _Module, root: _Module) -> Iterator[str]:
    where = "topk.py" if mod is root else mod.name
    for n in sorted(mod.needed):
        count = len(mod.binders.get(n, []))
        if count > 1 and not (mod is root and n == names.FUNCTION_NAME):
            yield f"{n} is bound {count} times in {where}"


def _rebinds(
    mod: _Module, mods: dict[str, _Module | None], root: _Module
) -> Iterator[tuple[str, int]]:
    """Why a name ``mod``'s covered code uses may not be what its statements bind it to,
    and the line of ``mod`` that says so."""
    where = "topk.py" if mod is root else mod.name
    # and the function itself: the text binds it once, yet this would swap what runs
    watched = {id(m): m.needed | ({names.FUNCTION_NAME} if m is root else set()) for m in
               [x for x in mods.values() if x is not None]}  # fmt: skip
    for n, line in mod.facts.declared_global:
        if n in mod.needed and (mod is root or _is_code(mod, n)):
            yield f"{n} is declared global at {where} line {line}", line
    aliases = {**mod.facts.aliases, **mod.modules}
    for (kind, ref), key, line in mod.facts.writes:
        if kind == "self":
            target = mod
        elif kind == "module":
            target = mods.get(ref)
        elif ref in aliases:
            target = mods.get(aliases[ref])
        else:  # an attribute of one of its own objects: a function's code, say
            if mod is root and ref in watched[id(mod)] and _is_code(mod, ref, functions=True):
                yield f"{ref}.{key} is written at {where} line {line}", line
            continue
        if target is None:
            continue
        tw = "topk.py" if target is root else target.name
        if key is None:
            yield f"{where} line {line} writes names of {tw} it computes", line
        elif key in watched[id(target)]:
            yield f"{key} of {tw} is rebound at {where} line {line}", line


def _is_code(mod: _Module, name: str, functions: bool = False) -> bool:
    """``name`` is bound by a def, class or import in ``mod`` (not module state); with
    ``functions``, by a def only."""
    kinds: tuple[type, ...] = (ast.FunctionDef, ast.AsyncFunctionDef)
    if not functions:
        kinds += (ast.ClassDef, ast.Import, ast.ImportFrom)
    for i in mod.binders.get(name, []):
        for x in _module_statements([mod.tree.body[i]]):
            if name in _bound(x) and isinstance(x, kinds):
                return True
    return False


def _constant(node: ast.AST | None) -> str | None:
    v = getattr(node, "value", None) if isinstance(node, ast.Constant) else None
    return v if isinstance(v, str) else None


def _module_ref(node: ast.AST, name: str) -> str | None:
    """The module ``node`` evaluates to when it is one (``sys.modules[__name__]``,
    ``sys.modules.get("x")``, ``importlib.import_module("x")``), else None; ``name`` is
    the module the code is in."""
    arg: ast.AST | None = None
    if isinstance(node, ast.Subscript) and _is_sys_modules(node.value):
        arg = node.slice
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "get" and _is_sys_modules(node.func.value) and node.args:
            arg = node.args[0]
        elif node.func.attr == "import_module" and node.args:
            arg = node.args[0]
    if isinstance(arg, ast.Name) and arg.id == "__name__":
        return name
    return _constant(arg)


def _is_sys_modules(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "modules"
        and getattr(node.value, "id", "") == "sys"
    )


@functools.lru_cache(maxsize=4)
def _parse(text: str) -> ast.Module:
    return ast.parse(text)  # one parse per text and process: the tree is only read


def _canon(node: Any) -> str:
    """A text of the AST that is the same on every Python version this runs on, without
    docstrings or other bare strings (no code)."""
    if isinstance(node, ast.AST):
        fields = [
            f"{f}={_canon(getattr(node, f, None))}"
            for f in node._fields
            if f not in _IGNORED_FIELDS
        ]
        return f"({type(node).__name__} {' '.join(fields)})"
    if isinstance(node, list):
        return "[" + " ".join(_canon(x) for x in node if not bare_string(x)) + "]"
    return repr(node)


def bare_string(node: Any) -> bool:
    """A statement that is only a string (a docstring): no code."""
    return isinstance(node, ast.Expr) and isinstance(getattr(node.value, "value", None), str)


def _module_statements(stmts: list[ast.stmt]):
    """Statements that run at import: module level and inside its compound statements."""
    for s in stmts:
        yield s
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for name in ("body", "orelse", "finalbody"):
            yield from _module_statements(getattr(s, name, []) or [])
        for h in getattr(s, "handlers", []) or []:
            yield from _module_statements(h.body)


def _bound(stmt: ast.stmt) -> set[str]:
    """Names a module-level statement binds (its own, not those of nested statements)."""
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {stmt.name}
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    targets: list[ast.AST] = []
    if isinstance(stmt, ast.Assign | ast.Delete):
        targets = stmt.targets
    elif isinstance(stmt, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor):
        targets = [stmt.target]
    elif isinstance(stmt, ast.With | ast.AsyncWith):
        targets = [i.optional_vars for i in stmt.items if i.optional_vars is not None]
    out = {n for t in targets for n in _target_names(t)}
    if isinstance(stmt, ast.Expr | ast.Assign | ast.AugAssign | ast.AnnAssign | ast.If):
        expr = [stmt.value] if not isinstance(stmt, ast.If) else [stmt.test]
        out |= {n.target.id for e in expr if e is not None for n in _walk_scope(e)
                if isinstance(n, ast.NamedExpr)}  # fmt: skip
    return out


def _target_names(t: ast.AST) -> Iterator[str]:
    """Names an assignment target binds (``x``, ``x, *y``), not ``x.a`` or ``x[i]``."""
    if isinstance(t, ast.Name):
        yield t.id
    elif isinstance(t, ast.Tuple | ast.List):
        for e in t.elts:
            yield from _target_names(e)
    elif isinstance(t, ast.Starred):
        yield from _target_names(t.value)


def _binding(tree: ast.Module, text: str) -> tuple[str, ast.FunctionDef | None]:
    """("", the def) when the module binds the function by one plain top-level def."""
    binders = [s for s in _module_statements(tree.body) if names.FUNCTION_NAME in _bound(s)]
    rebinds = re.search(rf"^\s*global\b[^\n]*\b{names.FUNCTION_NAME}\b", text, re.M)
    if not binders:
        return "absent", None
    only = binders[0]
    if len(binders) > 1 or rebinds:
        return f"{names.FUNCTION_NAME} is bound {len(binders)} times or rebound", None
    if not isinstance(only, ast.FunctionDef) or only not in tree.body:
        return f"{names.FUNCTION_NAME} is not a plain top-level def", None
    return "", only


def _loads(node: ast.AST) -> set[str]:
    """Names ``node`` reads, annotations left out."""
    out: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            out.add(n.id)
        for f, v in ast.iter_fields(n):
            if f in ("annotation", "returns"):
                continue
            stack.extend(x for x in (v if isinstance(v, list) else [v]) if isinstance(x, ast.AST))
    return out


def _used_statements(tree: ast.Module, fn: ast.AST) -> list[ast.stmt]:
    """Module-level statements (imports aside) binding a name the function uses,
    transitively, in file order."""
    candidates = [
        s for s in tree.body if s is not fn and not isinstance(s, ast.Import | ast.ImportFrom)
    ]
    needed, chosen = _loads(fn), set()
    changed = True
    while changed:
        changed = False
        for i, s in enumerate(candidates):
            if i in chosen:
                continue
            if set().union(*(_bound(x) for x in _module_statements([s]))) & needed:
                chosen.add(i)
                needed |= _loads(s)
                changed = True
    return [candidates[i] for i in sorted(chosen)]


def hip_flags(tree: ast.Module) -> tuple[str, ...]:
    """Module names bound to a HIP probe (``X = is_hip()``, ``torch.version.hip``)."""
    out = set()
    for s in _module_statements(tree.body):
        if isinstance(s, ast.Assign | ast.AnnAssign) and s.value is not None:
            hip = any(
                (isinstance(c, ast.Call) and call_name(c) in names.HIP_CALLS)
                or (isinstance(c, ast.Attribute) and c.attr == "hip")
                for c in ast.walk(s.value)
            )
            if hip:
                out |= _bound(s)
    return tuple(sorted(out)) or (names.HIP_FLAG,)


def predicates(used: list[ast.stmt]) -> tuple[str, ...]:
    """Upstream's predicate names, and module functions the function uses that read the
    server's EPLB settings (a renamed predicate)."""
    out = set(names.REMAP_PREDICATES)
    for s in used:
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and any(
            isinstance(n, ast.Attribute) and n.attr in names.EPLB_SETTINGS for n in ast.walk(s)
        ):
            out.add(s.name)
    return tuple(sorted(out))


def _remaps(fn: ast.AST, top: dict[str, ast.AST], seen: set[str]) -> bool:
    """A call of the remap outside ``if <not-HIP flag>:`` bodies, here or in a module
    function called from here (conservative: any such path counts)."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        n = stack.pop()
        if isinstance(n, ast.If) and getattr(n.test, "id", None) in names.NOT_HIP_FLAGS:
            stack.extend(n.orelse)
            continue
        if isinstance(n, ast.Call):
            name = call_name(n)
            if name == names.REMAP:
                return True
            if name in top and name not in seen:
                seen.add(name)
                if _remaps(top[name], top, seen):
                    return True
        stack.extend(ast.iter_child_nodes(n))
    return False
