"""Unified diffs that apply this package's fixes to upstream files (package data).

One ``.diff`` per upstream form; see each file's header. Read them with
``importlib.resources.files("sglang_amd_moe.patches")``.
"""
