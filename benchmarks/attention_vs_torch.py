"""Attention tiled over (batch, query-row blocks) (``stagegraph.stages.x86.attention``)
against the same x86 graph with tiling off and against PyTorch eager, at sizes past the
caches: ``softmax(Q K^T / sqrt(d) [+ causal mask]) V`` on ``[heads, seq, d]`` tensors,
written as PyTorch ops in a problem file of this script's own (not a KernelBench one).
One thread, thread CPU time, interleaved rounds (the harness of
``benchmarks/variants_vs_torch.py``). Usage:

    python benchmarks/attention_vs_torch.py [--shapes 2x4096x64,8x2048x64c] [--rounds 5]
        [--before 'normalize:attention={"row_block": 16}']

A shape is ``HEADSxSEQxDIM``, ``c`` at its end for a causal mask. ``--problem
FILE.py:name=value,...`` (repeatable) measures a problem file at those sizes as well, e.g.
``../shared/kernelbench/src/level3/l3_043_MinGPTCausalAttention.py:batch_size=4,seq_len=512``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

_MODEL = """import math
import torch
import torch.nn as nn
heads, seq, dim, causal = 2, 256, 64, 0
class Model(nn.Module):
    def forward(self, q, k, v):
        s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(dim))
        if causal:
            later = torch.ones(seq, seq, dtype=torch.bool).triu(1)
            s = s.masked_fill(later, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), v)
def get_inputs():
    return [torch.rand(heads, seq, dim), torch.rand(heads, seq, dim), torch.rand(heads, seq, dim)]
def get_init_inputs():
    return []
"""


def _spec(folder: Path, shape: str) -> str:
    causal = shape.endswith("c")
    heads, seq, dim = (int(x) for x in shape.rstrip("c").split("x"))
    path = folder / "attention_problem.py"
    path.write_text(_MODEL)
    return f"{path}:heads={heads},seq={seq},dim={dim},causal={int(causal)}"


def main() -> None:
    from variants_vs_torch import measure

    from stagegraph.app.host import describe, host_info

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="2x4096x64,8x2048x64c")
    parser.add_argument("--problem", action="append", default=[], metavar="FILE.py:SIZES")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--target", help="x86-64 level to compile for (default: the host)")
    parser.add_argument(
        "--before", action="append", metavar="STAGE:KEY=VALUE",
        help='what the before build overrides (default: normalize:attention={"enabled": false})',
    )  # fmt: skip
    args = parser.parse_args()
    args.scale = 1
    args.before = args.before or ['normalize:attention={"enabled": false}']
    print(f"{describe(host_info())}; 1 thread; thread CPU time; before: {' '.join(args.before)}; "
          "shared machine: under load\n")  # fmt: skip
    print("| shape | before ms | after ms | torch ms | before/after [p10, p90] "
          "| torch/after [p10, p90] |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        shapes = [s for s in args.shapes.split(",") if s]
        specs = [(s, _spec(Path(folder), s)) for s in shapes]
        specs += [(Path(spec.split(":")[0]).stem[:6], spec) for spec in args.problem]
        for shape, spec in specs:
            row = measure(Path(shape), args, spec)
            if "error" in row:
                print(f"| {shape} | error: {row['error'][:160]} | | | | |", flush=True)
                continue
            cells = [f"{row[f'{side}_ms']:.1f}" for side in ("before", "after", "torch")]
            for label in ("before/after", "torch/after"):
                mid, low, high = row[label]
                cells.append(f"{mid:.2f} [{low:.2f}, {high:.2f}]")
            print(f"| {shape} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
