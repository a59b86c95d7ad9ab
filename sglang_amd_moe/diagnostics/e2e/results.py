"""What the check reports, one row per (form, batch, with or without the plugin): plain
dataclasses without torch (the worker hands its rows back as JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: A run "matches" when bit-identical, or within this relative error (summation order).
REL_TOL = 1e-6


@dataclass
class Compare:
    """Real rows of a padded run against the unpadded run of the same tokens."""

    match: str  # "exact", "within 1e-6", "MISMATCH"
    max_abs_err: float  # over entries finite in both (nan if none)
    max_rel_err: float  # max_abs_err / max |reference|
    nan_count: int  # non-finite entries in the padded run's real rows
    bad_rows: int  # real rows not bit-identical to the reference


@dataclass
class RowResult:
    form: str
    source: str  # "installed" or "rebuilt"
    real: int
    padded: int
    plugin: bool
    compare: Compare | None = None
    out_of_range_ids: int = 0
    oob_stores: int = 0
    oob_reads: int = 0
    sorts: dict[str, int] = field(default_factory=dict)
    error: str = ""
    # The no-count rows with the plugin: what its guard's counters added in this row
    # (calls, out_of_range, past_count, real_out_of_range); None where no guard ran.
    guard: dict[str, int] | None = None


@dataclass
class FormInfo:
    source: str
    form: str
    note: str = ""
    hook_live: bool | None = None
    hook_message: str = ""
    reachable: bool = True


@dataclass
class CheckResult:
    """Everything the check found; :meth:`to_json` is the ``--json`` document."""

    sglang: str
    forms: list[FormInfo]
    without: list[RowResult]
    with_: list[RowResult]
    ok: bool
    meta: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        rows = {"without_plugin": self.without, "with_plugin": self.with_}
        doc = {"sglang": self.sglang, "forms": [asdict(f) for f in self.forms]}
        doc |= {k: [asdict(r) for r in v] for k, v in rows.items()}
        return doc | {"ok": self.ok, **self.meta}


def row_from_dict(d: dict[str, Any]) -> RowResult:
    """A :class:`RowResult` back from its ``dataclasses.asdict`` form."""
    cmp = d.get("compare")
    return RowResult(**{**d, "compare": Compare(**cmp) if cmp else None})
