// The registry of targets: one line per target. Each target's object lives in its folder.
#include <memory>

#include "targets/target.h"

namespace chroma {

std::unique_ptr<Target> make_cpu_target();
std::unique_ptr<Target> make_webgpu_target();
std::unique_ptr<Target> make_cuda_target();
std::unique_ptr<Target> make_metal_target();
std::unique_ptr<Target> make_null_target();

namespace {

const std::vector<std::unique_ptr<Target>>& registry() {
  static const std::vector<std::unique_ptr<Target>> targets = [] {
    std::vector<std::unique_ptr<Target>> t;
    t.push_back(make_cpu_target());
    t.push_back(make_webgpu_target());
    t.push_back(make_cuda_target());
    t.push_back(make_metal_target());
    t.push_back(make_null_target());
    return t;
  }();
  return targets;
}

}  // namespace

const Target& find_target(const std::string& name) {
  for (const auto& t : registry()) {
    if (name == t->name()) return *t;
  }
  std::string names;
  for (const std::string& n : target_names()) names += (names.empty() ? "" : ", ") + n;
  throw CompileError("target '" + name + "' is not supported (available: " + names + ")");
}

std::vector<std::string> target_names() {
  std::vector<std::string> out;
  for (const auto& t : registry()) out.emplace_back(t->name());
  return out;
}

}  // namespace chroma
