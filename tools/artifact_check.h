// Checks an artifact directory before its library is loaded (loading a library runs its
// code): manifest.json must be a Chroma manifest for this ABI, `library.file` a plain file in
// the directory, and the library's SHA-256 the manifest's. Used by chroma_run and fuzzed by
// tests/fuzz/fuzz_manifest.cpp; the Python loader (chroma/runtime/cpu.py) applies the same
// rules.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "chroma/chroma.h"
#include "chroma/detail/sha256.h"

namespace chroma_tools {

inline bool regular_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The manifest's entry points and state, rendered as chroma_signature() renders the
// library's (docs/artifact_format.md). Throws nlohmann::json::exception when malformed.
inline std::string manifest_signature(const nlohmann::json& m) {
  auto spec = [](const nlohmann::json& d) {
    std::string r = d.value("name", std::string()) + ":" + d.at("dtype").get<std::string>() + "[";
    const auto& shape = d.at("shape");
    if (!shape.is_array()) throw nlohmann::json::type_error::create(302, "shape is not a list", &d);
    for (size_t i = 0; i < shape.size(); ++i) r += (i ? "," : "") + std::to_string(shape[i].get<int64_t>());
    return r + "]";
  };
  std::string r;
  const auto& entries = m.at("entries");
  if (!entries.is_array()) throw nlohmann::json::type_error::create(302, "entries is not a list", &m);
  for (const auto& e : entries) {
    r += "entry " + e.value("name", std::string("forward")) + "(";
    const auto& ins = e.at("inputs");
    const auto& outs = e.at("outputs");
    if (!ins.is_array() || !outs.is_array()) throw nlohmann::json::type_error::create(302, "inputs/outputs", &e);
    for (size_t i = 0; i < ins.size(); ++i) r += (i ? "," : "") + spec(ins[i]);
    r += ")->(";
    for (size_t i = 0; i < outs.size(); ++i) r += (i ? "," : "") + spec(outs[i]);
    r += ")\n";
  }
  if (m.contains("state")) {
    if (!m["state"].is_array()) throw nlohmann::json::type_error::create(302, "state is not a list", &m);
    for (const auto& st : m["state"]) {
      r += "state " + st.value("name", std::string()) + ":" + std::to_string(st.at("bytes").get<int64_t>()) + "\n";
    }
  }
  return r;
}

// Parses `manifest_text` (the contents of dir/manifest.json) and checks the library it names.
// Returns "" and fills lib_path and manifest, or says what is wrong.
inline std::string check_manifest_text(const std::string& dir, const std::string& manifest_text, std::string* lib_path,
                                       nlohmann::json* manifest) {
  const std::string mpath = dir + "/manifest.json";
  try {
    nlohmann::json m = nlohmann::json::parse(manifest_text);
    if (!m.is_object() || m.value("format", std::string()) != "chroma.artifact") {
      return mpath + ": field 'format' is not 'chroma.artifact'";
    }
    if (!m.contains("abi_version") || m["abi_version"] != CHROMA_ABI_VERSION) {
      return mpath + ": field 'abi_version' does not match this program's " + std::to_string(CHROMA_ABI_VERSION);
    }
    const std::string file = m.at("library").at("file").get<std::string>();
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\0') != std::string::npos) {
      return mpath + ": field 'library.file' must name a file in the artifact directory";
    }
    *lib_path = dir + "/" + file;
    if (!regular_file(*lib_path)) return dir + ": library " + file + " is missing";
    const std::string want = m.at("library").at("sha256").get<std::string>();
    const std::string have = chroma::detail::sha256_hex(read_all(*lib_path));
    if (have != want) {
      return *lib_path + ": SHA-256 " + have + " does not match manifest field library.sha256 (" + want + ")";
    }
    (void)manifest_signature(m);  // the entries must be well formed before the library is asked
    *manifest = std::move(m);
  } catch (const std::exception& e) {
    return mpath + ": malformed manifest (" + e.what() + ")";
  }
  return "";
}

inline std::string check_artifact(const std::string& dir, std::string* lib_path, nlohmann::json* manifest) {
  const std::string mpath = dir + "/manifest.json";
  if (!regular_file(mpath)) return dir + ": not a Chroma artifact (no manifest.json)";
  return check_manifest_text(dir, read_all(mpath), lib_path, manifest);
}

}  // namespace chroma_tools
