"""Point the copies that ``from m import f`` made of a patched function at its replacement.

Both hooks replace a function on its module; modules that imported it by name before
that keep the original unless it is rebound there too. Install time only.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def rebind_copies(
    original: Any,
    replacement: Any,
    *,
    name: str | None = None,
    skip: set[tuple[int, str]] | frozenset[tuple[int, str]] = frozenset(),
) -> list[tuple[types.ModuleType, str]]:
    """Set every module attribute that is ``original`` to ``replacement``; return them.

    ``name``: only attributes of that name (otherwise any name, aliases included).
    ``skip``: ``(id(module), attribute)`` pairs to leave alone. A module whose namespace
    cannot be read or set is left alone too.
    """
    rebound: list[tuple[types.ModuleType, str]] = []
    for mod in list(sys.modules.values()):
        namespace = getattr(mod, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        try:
            names = (
                [name]
                if name is not None
                else [k for k, v in list(namespace.items()) if v is original]
            )
            for attr in names:
                if (id(mod), attr) not in skip and namespace.get(attr) is original:
                    setattr(mod, attr, replacement)
                    rebound.append((mod, attr))
        except Exception:  # an exotic module object: leave it alone
            continue
    return rebound
