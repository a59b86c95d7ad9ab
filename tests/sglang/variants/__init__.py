"""Rewritten ``topk.py`` variants: plausible future SGLang code, each with what it must do.

Each :class:`Variant` is an edit of a real release's ``topk.py`` (the edit must match
exactly once, so a variant cannot silently stop testing what it names), installed in
place of that release's file and driven through the real ``load_plugins()`` by
``runner.py``. Every variant states what the classifier must read, what the probe must
see, what the plugin must decide, and whether the function is right without the plugin;
with the plugin, every variant must come out right (padded rows: ids in range, weight 0;
real rows exactly as a correct release returns them, EPLB off and on), except where the
plugin is expected to refuse and the function is already right.

The catalog is in :mod:`variants.catalog`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

#: Release labels (``tools/compat/releases.py``) the variants are built on.
BASE_RELEASES = ("0.5.12.post1", "0.5.13.post1", "0.5.14-mask-under-eplb-guard", "0.5.23")


class DoesNotApply(Exception):
    """A variant's edit did not match its base source exactly once."""


def edit(text: str, old: str, new: str, count: int = 1) -> str:
    """``text`` with ``old`` replaced by ``new``; ``old`` must occur exactly ``count`` times."""
    found = text.count(old)
    if found != count:
        raise DoesNotApply(f"expected {count} x {old[:60]!r}..., found {found}")
    return text.replace(old, new)


def function_span(text: str, name: str = "_post_process_topk_ids") -> tuple[int, int]:
    """Start and end offsets of a top-level ``def name(`` up to the next top-level line."""
    m = re.search(rf"^def {name}\(", text, re.M)
    if m is None:
        raise DoesNotApply(f"no top-level def {name}")
    nxt = re.compile(r"^\S", re.M)
    end_m = nxt.search(text, text.index("\n", m.start()) + 1)
    while end_m is not None and text[end_m.start() :].startswith((")", "#")):
        end_m = nxt.search(text, end_m.end())
    end = end_m.start() if end_m else len(text)
    return m.start(), end


def indent(block: str, by: str = "    ") -> str:
    return "".join(by + line if line.strip() else line for line in block.splitlines(True))


@dataclass(frozen=True)
class Expect:
    """What must happen for one variant."""

    #: ``ledger.read(...).form`` of the rewritten topk.py (the ledger's answer).
    classifier: str
    #: The probe's behaviour verdict on the function that runs (None: the probe cannot
    #: run it).
    probe: str | None
    #: ``sglang_hook.status().state`` once topk is imported after ``load_plugins()``.
    state: str
    #: The plan's remap ("upstream", "add", "own"; None when nothing is hooked).
    remap: str | None = None
    #: The plan masks again after upstream on every call.
    post_mask: bool = False
    #: The function is right without the plugin (EPLB off and on).
    bare_right: bool = False
    #: ``topk`` cannot be imported at all (then nothing is driven).
    import_fails: bool = False


@dataclass(frozen=True)
class Variant:
    """One rewrite of a base release's topk.py."""

    name: str
    base: str  # a label of BASE_RELEASES
    why: str
    build: Callable[[str], dict[str, str]]  # base text -> {file name in moe/: text}
    expect: Expect
    #: Module names that mean HIP (for the test machine to take the HIP branch).
    hip_flags: tuple[str, ...] = ("_is_hip",)
    #: The name of the padded-count parameter, when the variant renamed it.
    count_param: str = "num_token_non_padded"
    #: How the plugin is loaded: "load_plugins", or "threads" (register() from 4 threads).
    load: str = "load_plugins"
    tags: tuple[str, ...] = field(default_factory=tuple)
