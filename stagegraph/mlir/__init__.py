"""Everything that touches the MLIR Python bindings: :mod:`.bindings` imports them (the only
module that does); the other modules are helpers over them (parsing and diagnostics).

Importing this package loads nothing: the bindings load when :mod:`.bindings` is imported.
"""
