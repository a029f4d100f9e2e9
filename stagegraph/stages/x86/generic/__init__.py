"""The generic (non-matmul) x86 schedule: the IR rewrites that prepare a payload for it
(:mod:`.prepare`, :mod:`.elementwise_fusion`), its labels on the ops (:mod:`.labels`), its
knobs (:mod:`.params`), its decisions (:mod:`.plan`) and the transform schedule
(:mod:`.schedule`), plus the row-wise vectorization of copies in lowering."""
