"""Light op classes, searched before the bindings' own dialect modules (see
:func:`stagegraph.mlir.bindings._prefer_light_op_views`).

When code asks a value for its defining op (``value.owner``), the bindings build the op's
Python class, importing its dialect's module first. For ``linalg`` that module also
defines every named op through OpDSL (0.13-0.18 s a process, a tenth of a small model's
compile). The module here registers the same generated op classes without OpDSL; code that
builds ops through OpDSL imports the full module itself, as before.
"""
