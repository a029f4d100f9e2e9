"""The x86 matmul schedule: which ops it takes (:mod:`.sites`, :mod:`.canonical`), its knobs
(:mod:`.params`) and the heuristic choosing them (:mod:`.heuristic`), the transform schedule
(:mod:`.schedule`) with its packed micro-kernel (:mod:`.packed_kernel`), constant weights
packed at compile time (:mod:`.constant_pack`), and the IR passes around it (first K block,
transposes, prefetch, broadcast reads)."""
