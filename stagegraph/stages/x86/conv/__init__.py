"""Convolution rewrites on x86: pointwise convolutions as matmuls (:mod:`.pointwise`),
strided transposed convolutions as phases (:mod:`.transposed`), and the 3-D, grouped and
channels-last rewrites before the generic schedule (:mod:`.rewrites`)."""
