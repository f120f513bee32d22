// The kinds and flags of the IR primitive Linalg (src/ir/ops.def), shared by the compiler (the
// IR, its text form, shape inference) and the run-time kernels (chroma/cpu/linalg.h), which is
// the only place that knows how each is computed.
#pragma once

namespace chroma::linalg {

enum Kind : int { kCholesky, kLu, kTriSolve, kGeqrf, kOrgqr, kOrmqr, kEigh, kSvd, kLdl, kLdlSolve, kExpm, kKindCount };
enum Flag : int { kUpper = 1, kLeft = 2, kTrans = 4, kUnit = 8, kFull = 16, kVectors = 32 };
// Names used by the IR's text form (Linalg.<kind>, {flag, ...}).
inline constexpr const char* kKindNames[kKindCount] = {"cholesky", "lu", "trisolve", "geqrf", "orgqr", "ormqr", "eigh", "svd",
                                                              "ldl", "ldl_solve", "expm"};
inline constexpr int kKindArity[kKindCount] = {1, 1, 2, 1, 2, 3, 1, 1, 1, 3, 1};
inline constexpr const char* kFlagNames[6] = {"upper", "left", "trans", "unit", "full", "vectors"};

}  // namespace chroma::linalg
