"""Real sizes for the KernelBench dev sets, as problem-file specs (``FILE.py:name=value``).

The shipped payloads are scaled down. The real-size tables measure the level-2 problems
with every input ``scale`` times larger (the batch constant of the payload's
``scaled_constants`` multiplied, as ``benchmarks/ops_vs_torch.py --scale`` does for level
1: :func:`scale_constants` is that one rule) and the dev level-3 models at batch 1 with
224x224 images (:data:`LEVEL3_MODELS`). ``benchmarks/kernelbench.py`` and
``benchmarks/compile_time.py`` both take their specs from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Module-level constants that count samples: scaling them makes every input larger by the
#: factor and leaves the model (its weights, channels, kernel sizes) as it is.
BATCH_NAMES = ("batch_size",)

#: The dev level-3 models (by problem number) and the overrides that give batch 1 with
#: 224x224 images. Derived constants follow (``input_shape = (batch_size, 3, 224, 224)``
#: is recomputed: overrides replace assignments before the file runs); VGG-16 has 224 as a
#: literal in ``get_inputs()``; EfficientNet-B1 ships 240x240 and is set to 224x224.
LEVEL3_MODELS: dict[str, dict[str, Any]] = {
    "l3_009": {"batch_size": 1},  # ResNet-18
    "l3_011": {"batch_size": 1},  # VGG-16
    "l3_015": {"batch_size": 1, "height": 224, "width": 224},  # DenseNet-121
    "l3_019": {"batch_size": 1, "height": 224, "width": 224},  # MobileNetV1
    "l3_023": {"batch_size": 1, "input_shape": (3, 224, 224)},  # EfficientNet-B1
    "l3_027": {"batch_size": 1, "image_height": 224, "image_width": 224},  # RegNet
    "l3_045": {"batch_size": 1, "height": 224, "width": 224},  # UNet (softmax)
}


def scale_constants(constants: dict[str, Any], scale: int) -> dict[str, Any]:
    """``constants`` with each batch constant (:data:`BATCH_NAMES`) times ``scale``; a key
    naming several constants at once (``height=width``) is scaled if any is one."""
    return {
        key: value * scale if set(key.split("=")) & set(BATCH_NAMES) else value
        for key, value in constants.items()
    }


def scaled_problem_spec(payload: Path, scale: int) -> str | None:
    """The problem-file spec of a shipped level-N payload (``levelN/lN_XXX_*.mlir``) at its
    ``scaled_constants`` with the batch times ``scale``; ``None`` without a problem file."""
    from kernelbench_torch_coverage import manifest_sizes, problem_file, problem_spec

    source = problem_file(payload)
    if source is None:
        return None
    level = int(payload.parent.name.removeprefix("level"))
    constants = manifest_sizes(payload.parent.parent, level).get(payload.stem[:6], {})
    return problem_spec(source, scale_constants(constants, scale))


def model_specs(root: Path, only: str = "") -> list[tuple[str, str]]:
    """``(name, spec)`` of each dev level-3 model of :data:`LEVEL3_MODELS` found under
    ``root/src/level3`` (names containing ``only``), at batch 1 with 224x224 images."""
    from kernelbench_torch_coverage import problem_spec

    specs = []
    for number, overrides in LEVEL3_MODELS.items():
        for path in sorted((root / "src" / "level3").glob(f"{number}_*.py")):
            if only in path.stem:
                specs.append((path.stem, problem_spec(path.resolve(), overrides)))
    return specs
