"""Compiled code that leaves the process: artifact folders, their manifest and C ABI.

:mod:`.manifest_json` reads a ``manifest.json`` with the standard library only (a GPU host
without pydantic uses it); :mod:`.manifest` is the pydantic schema of the same JSON.
Nothing in this package imports the MLIR bindings: running an artifact needs no compiler.
"""
