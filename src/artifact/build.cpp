#include "artifact/build.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "chroma/detail/sha256.h"
#include "ir/graph.h"

extern char** environ;

namespace chroma {
namespace fs = std::filesystem;
namespace {

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Digest of the header library, so editing a header invalidates cached builds.
std::string headers_digest(const std::string& include_dir) {
  chroma::detail::Sha256 h;
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(include_dir)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& p : files) {
    const std::string rel = fs::relative(p, include_dir).string();
    const std::string body = read_text(p);
    h.update(rel.data(), rel.size());
    h.update(body.data(), body.size());
  }
  return h.hex_digest();
}

struct Job {
  pid_t pid = -1;
  std::string name, log;
  int unit = 0;  // index into the build's units; -1: the precompiled header
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};


pid_t spawn(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw CompileError("cannot run the C++ compiler '" + argv[0] + "': " + std::strerror(rc));
  return pid;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& a : v) s += (s.empty() ? "" : " ") + a;
  return s;
}

// GCC finds precompiled headers by name next to the header; Clang does not (it needs
// -include-pch), so the header is precompiled for GCC only.
bool compiler_is_gcc(const std::string& cxx) {
  static std::mutex mu;
  static std::map<std::string, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(cxx); it != known.end()) return it->second;
  bool gcc = false;
  const fs::path log = fs::temp_directory_path() / ("chroma-cxx-version" + unique_suffix());
  try {
    const pid_t pid = spawn({cxx, "--version"}, log.string());
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    const std::string v = read_text(log);
    gcc = WIFEXITED(status) && WEXITSTATUS(status) == 0 && v.find("clang") == std::string::npos &&
          (v.find("GCC") != std::string::npos || v.find("g++") != std::string::npos || v.find("Free Software Foundation") != std::string::npos);
  } catch (const CompileError&) {
  }
  std::error_code ec;
  fs::remove(log, ec);
  known[cxx] = gcc;
  return gcc;
}

}  // namespace

std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  return ".tmp" + std::to_string(::getpid()) + "-" +
         std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()) % 1000000) + "-" +
         std::to_string(counter.fetch_add(1));
}

BuildResult build_library(const std::vector<std::pair<std::string, std::string>>& files, const std::string& src_dir,
                          const std::string& out_dir, const BuildOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  BuildResult r;
  std::string cxx = opts.compiler;
  if (const char* env = std::getenv("CXX"); env && *env && opts.compiler == "c++") cxx = env;
  // -fvect-cost-model=cheap: -O2's default ("very cheap") leaves fused loops with a strided
  // operand scalar (a SwiGLU over interleaved halves, for one: bench/results/README.md). It changes
  // no result: float reductions are never reassociated without -ffast-math.
  // -fno-trapping-math: nothing reads the floating-point exception flags, and without it GCC
  // keeps a select whose one side divides (erf, tanh, log1p in chroma/cpu/scalar.h) as a branch,
  // which leaves the loop scalar (bench/results/README.md). It changes no value: no reassociation,
  // no contraction.
  std::vector<std::string> flags = {"-std=c++20",       "-O2", "-fvect-cost-model=cheap", "-fPIC", "-fvisibility=hidden",
                                    "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-march=native", "-w",
                                    "-I" + opts.include_dir};
  if (!opts.python_include.empty()) {
    flags.push_back("-DCHROMA_WITH_PYTHON=1");
    flags.push_back("-I" + opts.python_include);
  }
  flags.insert(flags.end(), opts.extra_flags.begin(), opts.extra_flags.end());
  for (const std::string& d : opts.header_dirs) flags.push_back("-I" + d);
  // $CHROMA_EXTRA_CXXFLAGS (space-separated) is appended to the compile and link commands:
  // scripts/sanitize.sh builds the generated code with ASan and UBSan this way. The flags are
  // part of the command, hence of the cache key.
  std::vector<std::string> env_flags;
  if (const char* extra = std::getenv("CHROMA_EXTRA_CXXFLAGS")) {
    std::istringstream in(extra);
    for (std::string f; in >> f;) env_flags.push_back(f);
  }
  flags.insert(flags.end(), env_flags.begin(), env_flags.end());
  std::vector<std::string> link = {cxx, "-shared", "-o"};
  link.insert(link.begin() + 1, env_flags.begin(), env_flags.end());

  chroma::detail::Sha256 key;
  for (const auto& [name, body] : files) {
    key.update(name.data(), name.size());
    key.update(body.data(), body.size());
  }
  std::vector<std::string> libs;
  if (opts.blas) libs.push_back("-lopenblas");
  if (opts.dnnl) libs.insert(libs.end(), {"-ldnnl", "-lgomp"});
  if (opts.crypto) libs.push_back("-lcrypto");  // chroma/detail/sha256.h
  libs.insert(libs.end(), opts.link_flags.begin(), opts.link_flags.end());
  const std::string cmd = cxx + " " + join(flags) + " " + join(libs);
  key.update(cmd.data(), cmd.size());
  // Every header a unit can include: the extra header directories' (metal-cpp's) and the
  // runtime's. Both keys below (the library's and each object's) cover them.
  std::string hd;
  for (const std::string& d : opts.header_dirs) hd += headers_digest(d);
  // Objects were cached without the extra directories' headers before: a library linked from
  // such an object may sit in a cache under the key a correct build now has. "v2" moves these
  // builds (metal-cpp's) to new keys.
  if (!opts.header_dirs.empty()) hd += "objects-v2";
  hd += headers_digest(opts.include_dir);
  key.update(hd.data(), hd.size());
  r.cache_key = key.hex_digest();
  r.command = cmd;
  // Named by content: the dynamic loader hands back an already loaded library for a path it
  // has seen, so recompiling another model into the same directory must give a new name.
  r.library_file = "model-" + r.cache_key.substr(0, 16) + ".so";
  r.library_path = (fs::path(out_dir) / r.library_file).string();

  const bool tty = isatty(2);
  fs::path cached;
  if (!opts.cache_dir.empty()) {
    cached = fs::path(opts.cache_dir) / "build" / (r.cache_key + ".so");
    if (fs::exists(cached)) {
      // Copy then rename: a new inode, so a process that has the old library loaded keeps
      // its mapping intact and a later dlopen of this path loads the new file.
      const std::string tmp = r.library_path + unique_suffix();
      fs::copy_file(cached, tmp, fs::copy_options::overwrite_existing);
      fs::rename(tmp, r.library_path);
      r.cached = true;
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return r;
    }
  }

  const fs::path obj_dir = fs::path(out_dir) / (".build" + unique_suffix());
  fs::create_directories(obj_dir);
  // Object files are cached by content too (source, command, headers): the files that are
  // the same for every model (host.cpp, dnnl.cpp) compile once per command, and so does the
  // precompiled kernel header.
  const fs::path obj_cache = opts.cache_dir.empty() ? fs::path() : fs::path(opts.cache_dir) / "build" / "obj";
  const std::string compile_cmd = cxx + " " + join(flags);  // the libraries do not change objects
  auto object_key = [&](const std::string& body) {
    chroma::detail::Sha256 h;
    h.update(compile_cmd.data(), compile_cmd.size());
    h.update(hd.data(), hd.size());
    h.update(body.data(), body.size());
    return h.hex_digest();
  };
  const std::string pch_include = "#include \"" + opts.pch_header + "\"";
  auto uses_pch = [&](const std::string& body) { return !opts.pch_header.empty() && body.find(pch_include) != std::string::npos; };

  struct Unit {
    std::string name, src, obj, cached_obj;  // cached_obj: where to store it ("" when not caching)
    bool pch = false;
  };
  std::vector<Unit> units;
  std::vector<std::string> objects;
  bool any_pch_user = false;
  for (const auto& [name, body] : files) {
    Unit u;
    u.name = name;
    u.src = (fs::path(src_dir) / name).string();
    u.obj = (obj_dir / (name + ".o")).string();
    if (!obj_cache.empty()) {
      const fs::path c = obj_cache / (object_key(body) + ".o");
      if (fs::exists(c)) {
        objects.push_back(c.string());  // linked in place: cache entries are only ever replaced by rename
        continue;
      }
      u.cached_obj = c.string();
    }
    u.pch = uses_pch(body);
    any_pch_user = any_pch_user || u.pch;
    objects.push_back(u.obj);
    units.push_back(std::move(u));
  }
  // Files that do not use the precompiled header go first, next to the header's own compile.
  std::stable_partition(units.begin(), units.end(), [](const Unit& u) { return !u.pch; });

  // The precompiled header: <cache>/build/pch/<key>/<header>.gch, found by GCC through a -I
  // ahead of the header library's (GCC looks for "<header>.gch" in each include directory
  // before the header itself, and skips one it cannot use, so a stale or foreign file only
  // costs the time it saves).
  fs::path pch_dir, pch_file;
  bool pch_pending = false;
  if (any_pch_user && !opts.cache_dir.empty() && compiler_is_gcc(cxx) && !std::getenv("CHROMA_NO_PCH")) {
    chroma::detail::Sha256 h;
    h.update(compile_cmd.data(), compile_cmd.size());
    h.update(hd.data(), hd.size());
    pch_dir = fs::path(opts.cache_dir) / "build" / "pch" / h.hex_digest().substr(0, 24);
    pch_file = pch_dir / (opts.pch_header + ".gch");
    pch_pending = !fs::exists(pch_file);
  }

  int jobs = opts.jobs > 0 ? opts.jobs : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<Job> running;
  size_t next = 0, done = 0;
  std::string failure;
  std::string pch_tmp;
  auto finish = [&](size_t i, int status) {
    const bool ok = status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    Job j = running[i];
    running.erase(running.begin() + static_cast<long>(i));
    r.steps.emplace_back(j.name, std::chrono::duration<double>(std::chrono::steady_clock::now() - j.start).count());
    if (j.unit < 0) {  // the precompiled header: without it the files still compile, only slower
      std::error_code ec;
      if (ok) fs::rename(pch_tmp, pch_file, ec);
      if (!ok || ec) fs::remove(pch_tmp, ec);
      pch_pending = false;
      return;
    }
    const Unit& u = units[static_cast<size_t>(j.unit)];
    ++done;
    if (!ok && failure.empty()) failure = "compiling " + u.name + " failed:\n" + read_text(j.log);
    if (ok && !u.cached_obj.empty()) {
      std::error_code ec;
      fs::create_directories(obj_cache, ec);
      const std::string tmp = u.cached_obj + unique_suffix();
      fs::copy_file(u.obj, tmp, fs::copy_options::overwrite_existing, ec);
      if (!ec) fs::rename(tmp, u.cached_obj, ec);
      if (ec) fs::remove(tmp, ec);
    }
    if (tty) std::fprintf(stderr, "\r[chroma] compiled %zu/%zu %-24s", done, units.size(), u.name.c_str());
  };
  // Reaps one of this build's own compiler processes (never another child of the process:
  // a second build in another thread, or the user's own subprocesses).
  auto wait_one = [&]() {
    int status = 0;
    for (;;) {
      for (size_t i = 0; i < running.size(); ++i) {
        const pid_t pid = ::waitpid(running[i].pid, &status, WNOHANG);
        if (pid == 0) continue;
        if (pid < 0 && errno == EINTR) continue;
        if (pid < 0) status = -1;  // lost (ECHILD: someone reaped it): count it as failed
        finish(i, status);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  if (pch_pending) {
    std::error_code ec;
    fs::create_directories(pch_file.parent_path(), ec);
    pch_tmp = pch_file.string() + unique_suffix();
    std::vector<std::string> argv = {cxx};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"-x", "c++-header", (fs::path(opts.include_dir) / opts.pch_header).string(), "-o", pch_tmp});
    Job j;
    j.name = opts.pch_header;
    j.log = (obj_dir / "pch.log").string();
    j.pid = spawn(argv, j.log);
    j.unit = -1;
    running.push_back(j);
  }
  while (next < units.size() || !running.empty()) {
    while (next < units.size() && static_cast<int>(running.size()) < jobs && failure.empty() &&
           !(units[next].pch && pch_pending)) {
      const Unit& u = units[next];
      std::vector<std::string> argv = {cxx};
      if (u.pch && !pch_dir.empty() && fs::exists(pch_file)) argv.push_back("-I" + pch_dir.string());
      argv.insert(argv.end(), flags.begin(), flags.end());
      argv.insert(argv.end(), {"-c", u.src, "-o", u.obj});
      Job j;
      j.name = u.name;
      j.log = (obj_dir / (u.name + ".log")).string();
      j.pid = spawn(argv, j.log);
      j.unit = static_cast<int>(next);
      running.push_back(j);
      ++next;
    }
    if (running.empty()) break;
    wait_one();
  }
  if (tty) std::fprintf(stderr, "\n");
  if (!failure.empty()) throw CompileError("building the generated code: " + failure);
  std::vector<std::string> argv = link;
  const std::string tmp_lib = r.library_path + unique_suffix();
  argv.push_back(tmp_lib);
  argv.insert(argv.end(), objects.begin(), objects.end());
  argv.insert(argv.end(), libs.begin(), libs.end());
  const std::string log = (obj_dir / "link.log").string();
  const auto link_start = std::chrono::steady_clock::now();
  pid_t pid = spawn(argv, log);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.steps.emplace_back("link", std::chrono::duration<double>(std::chrono::steady_clock::now() - link_start).count());
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) throw CompileError("linking the generated code failed:\n" + read_text(log));
  fs::rename(tmp_lib, r.library_path);
  fs::remove_all(obj_dir);
  if (!cached.empty()) {
    std::error_code ec;
    fs::create_directories(cached.parent_path(), ec);
    const fs::path tmp = cached.string() + unique_suffix();
    fs::copy_file(r.library_path, tmp, fs::copy_options::overwrite_existing, ec);
    if (!ec) fs::rename(tmp, cached, ec);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string find_nvcc() {
  if (const char* env = std::getenv("CHROMA_NVCC")) {
    const std::string v = env;
    if (v == "off" || v == "0" || v == "none") return "";
    if (!v.empty()) return v;
  }
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    std::string dir;
    while (std::getline(ss, dir, ':')) {
      if (!dir.empty() && ::access((fs::path(dir) / "nvcc").c_str(), X_OK) == 0) return (fs::path(dir) / "nvcc").string();
    }
  }
  return ::access("/usr/local/cuda/bin/nvcc", X_OK) == 0 ? "/usr/local/cuda/bin/nvcc" : "";
}

std::vector<std::string> fatbin_architectures() {
  // $CHROMA_CUDA_ARCHS ("90" or "80,90"): cubins for those only, and the last one's PTX (a
  // device check compiling hundreds of models for the one GPU it has).
  if (const char* env = std::getenv("CHROMA_CUDA_ARCHS"); env && *env) {
    std::vector<std::string> out;
    std::stringstream ss(env);
    std::string a, last;
    while (std::getline(ss, a, ',')) {
      if (a.empty() || a.find_first_not_of("0123456789") != std::string::npos) {
        throw CompileError("CHROMA_CUDA_ARCHS='" + std::string(env) + "': expected compute capabilities such as 80,90");
      }
      out.insert(out.end(), {"-gencode", "arch=compute_" + a + ",code=sm_" + a});
      last = a;
    }
    out.insert(out.end(), {"-gencode", "arch=compute_" + last + ",code=compute_" + last});
    return out;
  }
  return {"-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90", "-gencode",
          "arch=compute_90,code=compute_90"};
}

FatbinResult build_fatbin(const std::string& cu_path, const std::string& out_path, const std::string& nvcc,
                          const std::string& cache_dir) {
  const auto t0 = std::chrono::steady_clock::now();
  FatbinResult r;
  r.path = out_path;
  std::vector<std::string> argv = {nvcc, "-fatbin", "-std=c++17", "-O3"};
  for (const std::string& a : fatbin_architectures()) argv.push_back(a);
  for (const char* a : {"-Xptxas", "-warn-spills"}) argv.emplace_back(a);
  r.command = join(argv) + " -o " + fs::path(out_path).filename().string() + " " + fs::path(cu_path).filename().string();
  fs::path cached;
  if (!cache_dir.empty()) {
    detail::Sha256 h;
    const std::string text = read_text(cu_path);
    h.update(r.command.data(), r.command.size());
    h.update(text.data(), text.size());
    cached = fs::path(cache_dir) / "build" / ("fatbin-" + h.hex_digest().substr(0, 32));
    std::error_code ec;
    if (fs::exists(cached.string() + ".fatbin", ec)) {
      const fs::path tmp = out_path + unique_suffix();
      fs::copy_file(cached.string() + ".fatbin", tmp, fs::copy_options::overwrite_existing, ec);
      if (!ec) fs::rename(tmp, out_path, ec);
      if (!ec) {
        r.log = read_text(cached.string() + ".log");
        r.cached = true;
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return r;
      }
    }
  }
  const std::string tmp = out_path + unique_suffix();
  const std::string log = tmp + ".log";
  argv.push_back("-o");
  argv.push_back(tmp);
  argv.push_back(cu_path);
  pid_t pid = -1;
  try {
    pid = spawn(argv, log);
  } catch (const CompileError& e) {
    throw CompileError(std::string(e.what()) + " (nvcc, from $CHROMA_NVCC, PATH or /usr/local/cuda/bin; CHROMA_NVCC=off compiles "
                       "without the fatbin)");
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.log = read_text(log);
  std::error_code ec;
  fs::remove(log, ec);
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    fs::remove(tmp, ec);
    throw CompileError("nvcc failed on the generated " + fs::path(cu_path).filename().string() + ":\n" + r.log);
  }
  fs::rename(tmp, out_path);
  if (!cached.empty()) {
    fs::create_directories(cached.parent_path(), ec);
    const std::string t = cached.string() + unique_suffix();
    std::ofstream(t + ".log") << r.log;
    fs::rename(t + ".log", cached.string() + ".log", ec);
    fs::copy_file(out_path, t, fs::copy_options::overwrite_existing, ec);
    if (!ec) fs::rename(t, cached.string() + ".fatbin", ec);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace chroma
