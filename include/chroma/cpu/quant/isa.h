// Which of gemm_quant's kernels a compilation has, from the instruction sets it targets
// (-march): one place that says it, read by every part of gemm_quant.h.
//
//   CHROMA_QUANT_FP32_AVX2     AVX2 + FMA + F16C: weights decoded to float32 in 256-bit
//                              registers (quant/avx2.h)
//   CHROMA_QUANT_INT8_AVX2     that, without AVX512-VNNI: q4/q6 with int8 activations and
//                              vpmaddubsw (quant/avx2.h)
//   CHROMA_QUANT_AVX512        AVX512F + BW: 512-bit decoding (quant/avx512.h)
//   CHROMA_QUANT_BF16_KERNELS  that and AVX512-BF16: vdpbf16ps kernels (quant/avx512.h)
//   CHROMA_QUANT_INT8_KERNELS  AVX-512 and AVX512-VNNI: vpdpbusd kernels (quant/avx512.h)
//   CHROMA_QUANT_AMX_KERNELS   the BF16 kernels and AMX-TILE + AMX-BF16 (quant/amx.h)
//
// None of them: the portable code (quant/layout.h) and gemm_packed's float32 tiles.
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define CHROMA_QUANT_FP32_AVX2 1
#endif
#if defined(__AVX512BW__) && defined(__AVX512F__)
#define CHROMA_QUANT_AVX512 1
#endif
#if defined(__AVX512BF16__) && defined(CHROMA_QUANT_AVX512)
#define CHROMA_QUANT_BF16_KERNELS 1
#endif
#if defined(__AVX512VNNI__) && defined(CHROMA_QUANT_AVX512)
#define CHROMA_QUANT_INT8_KERNELS 1
#elif defined(CHROMA_QUANT_FP32_AVX2)
#define CHROMA_QUANT_INT8_AVX2 1
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(CHROMA_QUANT_BF16_KERNELS)
#define CHROMA_QUANT_AMX_KERNELS 1
#endif
