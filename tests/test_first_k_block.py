"""Register tiles of several K blocks start from zero and add packed C after the k loop; the
first K block starts from the fill (stages/x86/matmul/first_k_block.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("stagegraph.mlir.bindings")

# A K-block loop over a packed C of 2 tiles (vector<4x8xf32>): a fill pass writes zeros,
# then each K block loads every tile's accumulators, runs a k loop and stores them back.
# ``{use}`` is how the tile load is used: as the k loop's initial value (an accumulator
# load) or by an add (packed C read some other way).
_PAYLOAD = """
func.func @f(%x: vector<4x8xf32>) -> tensor<2x4x8xf32> {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %zero = arith.constant dense<{fill}> : vector<4x8xf32>
  %pad = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<2x4x8xf32>
  %filled = scf.for %i = %c0 to %c2 step %c1 iter_args(%t = %empty) -> (tensor<2x4x8xf32>) {{
    %w = vector.transfer_write %zero, %t[%i, %c0, %c0] {{in_bounds = [true, true]}}
        : vector<4x8xf32>, tensor<2x4x8xf32>
    scf.yield %w : tensor<2x4x8xf32>
  }}
  %r = scf.for %kb = %c0 to %c3 step %c1 iter_args(%p = %filled) -> (tensor<2x4x8xf32>) {{
    %tiles = scf.for %i = %c0 to %c2 step %c1 iter_args(%q = %p) -> (tensor<2x4x8xf32>) {{
      %acc = vector.transfer_read %q[%i, %c0, %c0], %pad {{in_bounds = [true, true]}}
          : tensor<2x4x8xf32>, vector<4x8xf32>
      {use}
      {write}
      scf.yield %w : tensor<2x4x8xf32>
    }}
    scf.yield %tiles : tensor<2x4x8xf32>
  }} {{stagegraph.k_blocks}}
  return %r : tensor<2x4x8xf32>
}}
"""
_ACCUMULATE = """%sum = scf.for %k = %c0 to %c2 step %c1 iter_args(%a = %acc) -> (vector<4x8xf32>) {
        %n = arith.addf %a, %x : vector<4x8xf32>
        scf.yield %n : vector<4x8xf32>
      }"""
_OTHER_READ = "%sum = arith.addf %acc, %x : vector<4x8xf32>"
_WRITE = """%w = vector.transfer_write %sum, %q[%i, %c0, %c0] {in_bounds = [true, true]}
          : vector<4x8xf32>, tensor<2x4x8xf32>"""
# A write of the tile's first two rows only: the other two keep what the fill wrote.
_MASKED_WRITE = """%m = vector.constant_mask [2, 8] : vector<4x8xi1>
      %w = vector.transfer_write %sum, %q[%i, %c0, %c0], %m {in_bounds = [true, true]}
          : vector<4x8xf32>, tensor<2x4x8xf32>"""


def _rewritten(use: str, write: str = _WRITE) -> tuple[int, list[str], str]:
    """(loops rewritten, op names after, the K-block loop's init's defining op)."""
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.x86.matmul.first_k_block import (
        K_BLOCKS_ATTR,
        start_first_k_block_from_fill,
    )

    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(_PAYLOAD.format(use=use, write=write, fill="0.0"))
        count = start_first_k_block_from_fill(module)
        module.operation.verify()
        names = [op.name for op in collect(module)]
        kloop = next(op for op in collect(module, "scf.for") if _returned(op))
        assert not any(K_BLOCKS_ATTR in op.attributes for op in collect(module))
        return count, names, kloop.operands[3].owner.name


def _returned(op) -> bool:
    return bool(op.results) and any(use.owner.name == "func.return" for use in op.results[0].uses)


def test_accumulator_loads_of_the_first_k_block_start_from_the_fill():
    """The fill pass is gone (packed C starts as the empty tensor) and each tile's load
    runs only after the first K block: the first takes the fill value."""
    count, names, init = _rewritten(_ACCUMULATE)
    assert count == 1 and init == "tensor.empty"
    assert names.count("scf.if") == 1 and names.count("scf.for") == 3  # no fill loop left
    assert names.count("vector.transfer_read") == 1


def test_packed_c_read_otherwise_is_left_alone():
    """A read of packed C that does not start a k loop: the fill stays, nothing changes."""
    count, names, init = _rewritten(_OTHER_READ)
    assert count == 0 and init == "scf.for"
    assert "scf.if" not in names and names.count("scf.for") == 3  # fill, K blocks, tiles


def test_a_masked_write_of_packed_c_keeps_the_fill():
    """A tile written through a mask keeps the fill in its other lanes: left alone."""
    count, names, init = _rewritten(_ACCUMULATE, _MASKED_WRITE)
    assert count == 0 and init == "scf.for" and "scf.if" not in names


def _tile_body(fill: str) -> tuple[list[str], object, object]:
    """The rewritten register-tile loop body of an accumulating payload with fill value
    ``fill``: (its op names in order, the k loop's initial accumulator's defining op, the
    scf.if after it)."""
    from stagegraph.mlir.bindings import ir, new_context
    from stagegraph.mlir.walk import collect
    from stagegraph.stages.x86.matmul.first_k_block import start_first_k_block_from_fill

    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(_PAYLOAD.format(use=_ACCUMULATE, write=_WRITE, fill=fill))
        assert start_first_k_block_from_fill(module) == 1
        module.operation.verify()
        kloop = next(
            op for op in collect(module, "scf.for") if isinstance(op.results[0].type, ir.VectorType)
        )
        body = kloop.parent.regions[0].blocks[0]
        names = [op.name for op in body.operations]
        choice = next(op for op in body.operations if op.name == "scf.if")
        then_names = [op.name for op in choice.regions[0].blocks[0].operations]
        else_names = [op.name for op in choice.regions[1].blocks[0].operations]
        write = next(op for op in body.operations if op.name == "vector.transfer_write")
        assert write.operands[0] == choice.results[0]  # the tile stores the sum
        init_op = kloop.operands[3].owner
        init = (init_op.name, str(init_op.attributes["value"]))
        return names, init, (then_names, else_names)


def test_k_loops_start_from_zero_and_add_packed_c_after():
    """The k loop's accumulators start as a zero constant; packed C is loaded after the k
    loop (in the branch taken after the first K block) and added to its result, which the
    tile stores. A zero fill adds nothing in the first K block."""
    names, init, (then_names, else_names) = _tile_body("0.0")
    assert init == ("arith.constant", "dense<0.000000e+00> : vector<4x8xf32>")
    assert names.index("scf.for") < names.index("scf.if") < names.index("vector.transfer_write")
    assert "vector.transfer_read" not in names  # only inside the branch
    assert then_names == ["scf.yield"]
    assert else_names == ["vector.transfer_read", "arith.addf", "scf.yield"]


def test_a_nonzero_fill_is_added_in_the_first_k_block():
    """C = 1 + A B: the first K block adds the fill value to the k loop's result."""
    _, init, (then_names, else_names) = _tile_body("1.0")
    assert init == ("arith.constant", "dense<0.000000e+00> : vector<4x8xf32>")
    assert then_names == ["arith.addf", "scf.yield"]
    assert else_names == ["vector.transfer_read", "arith.addf", "scf.yield"]
