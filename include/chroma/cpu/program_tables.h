// The tables a generated program.cpp defines and the prebuilt entry points
// (chroma/cpu/program_main.h, compiled once per compiler command in host.cpp) read.
//
// They have external linkage inside the library (hidden outside it, like everything but the
// C ABI), so the entry points do not depend on the model: their object file is the same for
// every model built with the same flags and headers, and the build cache reuses it.
#pragma once

#include <cstdint>

#include "chroma/cpu/runtime.h"

namespace chroma_gen {

extern const int kNumEntries;
extern const ::chroma::rt::EntryInfo kEntries[];
extern const int kNumStates;
extern const ::chroma::rt::StateInfo kStates[];
extern const int64_t kStateBytes;
extern const int64_t kArenaBytes;
extern const int64_t kWeightsBytes;
extern const char* const kWeightsDigest;  // sha256-tree-16MiB of weights.bin, hex
extern const char* const kSourceDigest;   // SHA-256 of the generated sources, hex

}  // namespace chroma_gen
