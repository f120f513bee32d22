"""Chroma's quantization layer: weight formats (`quant.weights_spec`), the simulation of
quantized weights and the accuracy report against float32 (`quant`). Imports the runtime and
the base modules."""
