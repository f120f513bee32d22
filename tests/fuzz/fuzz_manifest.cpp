// libFuzzer target: an artifact's manifest.json through the checks a host runs before it
// loads the library (tools/artifact_check.h): every input must give "" or a message, never a
// crash or an escaped exception. The directory holds one small file posing as the library.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "artifact_check.h"

namespace {

const std::string& artifact_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/chroma-fuzz-manifest-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    if (!d) std::abort();
    std::ofstream(std::string(d) + "/model-0123456789abcdef.so") << "not really a library";
    return std::string(d);
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string lib;
  nlohmann::json m;
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)chroma_tools::check_manifest_text(artifact_dir(), text, &lib, &m);
  try {
    (void)chroma_tools::manifest_signature(nlohmann::json::parse(text));
  } catch (const nlohmann::json::exception&) {
  }
  return 0;
}
