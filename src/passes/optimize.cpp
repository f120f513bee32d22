#include "passes/optimize.h"

#include "passes/cse.h"
#include "passes/dce.h"
#include "passes/fold_constants.h"
#include "passes/rewrite.h"
#include "passes/widen_half.h"

namespace chroma {

Graph optimize(const Graph& g, bool keep_half_weights) {
  Graph r = run_pass("widen_half", &widen_half, g);
  // The roundings widen_half made and nothing reads: gone before folding looks at readers.
  r = run_pass("eliminate_dead_code", &eliminate_dead_code, r);
  r = keep_half_weights ? run_pass("fold_constants", &fold_constants_keep_half, r) : run_pass("fold_constants", &fold_constants, r);
  r = run_pass("eliminate_dead_code", &eliminate_dead_code, r);
  r = run_pass("eliminate_common_subexpressions", &eliminate_common_subexpressions, r);
  r = run_pass("eliminate_dead_code", &eliminate_dead_code, r);
  return r;
}

}  // namespace chroma
