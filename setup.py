"""Package discovery, kept out of ``pyproject.toml`` because it cannot be said there.

Every package under ``sglang_amd_moe/`` is found, never listed, so a new subpackage
ships without anyone remembering to name it. ``kernels/`` and ``patches/`` live at the
top of the repository but install as ``sglang_amd_moe.kernels`` and
``sglang_amd_moe.patches`` (a top-level ``kernels`` would clash with the unrelated
registry package of that name that SGLang depends on); ``pyproject.toml`` maps their
folders and declares the package data by pattern. ``tests/test_packaging.py`` builds the
wheel and checks that every tracked file under the three folders is in it.
"""

from setuptools import find_namespace_packages, setup

MAPPED = ["sglang_amd_moe.kernels", "sglang_amd_moe.patches"]

setup(
    packages=[
        "sglang_amd_moe",
        # Namespace discovery: a folder of data files (diagnostics/e2e/guard_form/) is a
        # package too, so its files ship by the same patterns as every other package's.
        *(
            f"sglang_amd_moe.{name}"
            for name in find_namespace_packages(
                "sglang_amd_moe", exclude=["__pycache__", "*.__pycache__"]
            )
        ),
        *MAPPED,
    ],
)
