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

// The compiler and the flags of one build. Every compile runs `cxx` + `flags`; the link runs
// `cxx` + `env_flags` + "-shared -o <library>" + the objects + `libs`.
struct Toolchain {
  std::string cxx;
  std::vector<std::string> flags;
  std::vector<std::string> env_flags;  // $CHROMA_EXTRA_CXXFLAGS: also on the link line
  std::vector<std::string> libs;       // the libraries and the link flags, last on the link line

  // The whole command (the manifest's, and part of the library's cache key).
  std::string command() const { return cxx + " " + join(flags) + " " + join(libs); }
  // What an object depends on: the libraries do not change objects.
  std::string compile_command() const { return cxx + " " + join(flags); }
};

Toolchain toolchain(const BuildOptions& opts) {
  Toolchain tc;
  tc.cxx = opts.compiler;
  if (const char* env = std::getenv("CXX"); env && *env && opts.compiler == "c++") tc.cxx = env;
  // -fvect-cost-model=cheap: -O2's default ("very cheap") leaves fused loops with a strided
  // operand scalar (a SwiGLU over interleaved halves, for one: bench/results/README.md). It changes
  // no result: float reductions are never reassociated without -ffast-math.
  // -fno-trapping-math: nothing reads the floating-point exception flags, and without it GCC
  // keeps a select whose one side divides (erf, tanh, log1p in chroma/cpu/scalar.h) as a branch,
  // which leaves the loop scalar (bench/results/README.md). It changes no value: no reassociation,
  // no contraction.
  tc.flags = {"-std=c++20",       "-O2", "-fvect-cost-model=cheap", "-fPIC", "-fvisibility=hidden",
              "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-march=native", "-w",
              "-I" + opts.include_dir};
  if (!opts.python_include.empty()) {
    tc.flags.push_back("-DCHROMA_WITH_PYTHON=1");
    tc.flags.push_back("-I" + opts.python_include);
  }
  tc.flags.insert(tc.flags.end(), opts.extra_flags.begin(), opts.extra_flags.end());
  for (const std::string& d : opts.header_dirs) tc.flags.push_back("-I" + d);
  // $CHROMA_EXTRA_CXXFLAGS (space-separated) is appended to the compile and link commands:
  // scripts/sanitize.sh builds the generated code with ASan and UBSan this way. The flags are
  // part of the command, hence of the cache key.
  if (const char* extra = std::getenv("CHROMA_EXTRA_CXXFLAGS")) {
    std::istringstream in(extra);
    for (std::string f; in >> f;) tc.env_flags.push_back(f);
  }
  tc.flags.insert(tc.flags.end(), tc.env_flags.begin(), tc.env_flags.end());
  if (opts.blas) tc.libs.push_back("-lopenblas");
#ifdef CHROMA_DNNL_LIBRARY
  // oneDNN 3, the one Chroma was built with (CMakeLists.txt): its headers for every unit
  // (chroma/cpu/kernels.h includes the oneDNN kernels under CHROMA_DNNL), and the library by
  // its path with its directory as the run path, so the artifact loads the same library
  // with no environment set. Both are part of the command, hence of the cache keys.
  tc.flags.push_back("-DCHROMA_DNNL=1");
  tc.flags.push_back("-I" CHROMA_DNNL_INCLUDE);
  if (opts.dnnl) {
    const std::string lib = CHROMA_DNNL_LIBRARY;
    tc.libs.insert(tc.libs.end(), {lib, "-Wl,-rpath," + fs::path(lib).parent_path().string(), "-lgomp"});
  }
#endif
  if (opts.crypto) tc.libs.push_back("-lcrypto");  // chroma/detail/sha256.h
  tc.libs.insert(tc.libs.end(), opts.link_flags.begin(), opts.link_flags.end());
  return tc;
}

// Every header a unit can include: the extra header directories' (metal-cpp's) and the
// runtime's. Both cache keys (the library's and each object's) cover them.
std::string headers_key(const BuildOptions& opts) {
  std::string hd;
  for (const std::string& d : opts.header_dirs) hd += headers_digest(d);
  // Objects were cached without the extra directories' headers before: a library linked from
  // such an object may sit in a cache under the key a correct build now has. "v2" moves these
  // builds (metal-cpp's) to new keys.
  if (!opts.header_dirs.empty()) hd += "objects-v2";
  hd += headers_digest(opts.include_dir);
  return hd;
}

// The library's cache key: every source file (name and contents), the command, the headers.
std::string library_key(const std::vector<std::pair<std::string, std::string>>& files, const std::string& cmd,
                        const std::string& hd) {
  chroma::detail::Sha256 key;
  for (const auto& [name, body] : files) {
    key.update(name.data(), name.size());
    key.update(body.data(), body.size());
  }
  key.update(cmd.data(), cmd.size());
  key.update(hd.data(), hd.size());
  return key.hex_digest();
}

// Copies `from` to `to` through a temporary file and a rename: a new inode, so a process
// that has the old library loaded keeps its mapping intact and a later dlopen of this path
// loads the new file. Throws when the copy fails.
void copy_by_rename(const fs::path& from, const std::string& to) {
  const std::string tmp = to + unique_suffix();
  fs::copy_file(from, tmp, fs::copy_options::overwrite_existing);
  fs::rename(tmp, to);
}

// One source file to compile: into `obj`, then stored at `cached_obj` ("" when not caching).
struct Unit {
  std::string name, src, obj, cached_obj;
  bool pch = false;  // includes the precompiled header
};

// What the compile step has to do: the units whose objects are not in the object cache
// (those that do not use the precompiled header first), and every object the link takes, in
// the files' order (cached ones linked in place: cache entries are only ever replaced by
// rename).
struct UnitPlan {
  std::vector<Unit> units;
  std::vector<std::string> objects;
  bool any_pch_user = false;
};

// Object files are cached by content too (source, command, headers): the files that are the
// same for every model (host.cpp, dnnl.cpp) compile once per command, and so does the
// precompiled kernel header.
UnitPlan plan_units(const std::vector<std::pair<std::string, std::string>>& files, const std::string& src_dir,
                    const fs::path& obj_dir, const fs::path& obj_cache, const std::string& compile_cmd,
                    const std::string& hd, const std::string& pch_header) {
  auto object_key = [&](const std::string& body) {
    chroma::detail::Sha256 h;
    h.update(compile_cmd.data(), compile_cmd.size());
    h.update(hd.data(), hd.size());
    h.update(body.data(), body.size());
    return h.hex_digest();
  };
  const std::string pch_include = "#include \"" + pch_header + "\"";
  auto uses_pch = [&](const std::string& body) { return !pch_header.empty() && body.find(pch_include) != std::string::npos; };
  UnitPlan p;
  for (const auto& [name, body] : files) {
    Unit u;
    u.name = name;
    u.src = (fs::path(src_dir) / name).string();
    u.obj = (obj_dir / (name + ".o")).string();
    if (!obj_cache.empty()) {
      const fs::path c = obj_cache / (object_key(body) + ".o");
      if (fs::exists(c)) {
        p.objects.push_back(c.string());
        continue;
      }
      u.cached_obj = c.string();
    }
    u.pch = uses_pch(body);
    p.any_pch_user = p.any_pch_user || u.pch;
    p.objects.push_back(u.obj);
    p.units.push_back(std::move(u));
  }
  // Files that do not use the precompiled header go first, next to the header's own compile.
  std::stable_partition(p.units.begin(), p.units.end(), [](const Unit& u) { return !u.pch; });
  return p;
}

// The precompiled header: <cache>/build/pch/<key>/<header>.gch, found by GCC through a -I
// ahead of the header library's (GCC looks for "<header>.gch" in each include directory
// before the header itself, and skips one it cannot use, so a stale or foreign file only
// costs the time it saves). `dir` is empty when there is none; `pending`: it is to be built.
struct Pch {
  fs::path dir, file;
  bool pending = false;
};

Pch pch_location(bool any_pch_user, const BuildOptions& opts, const Toolchain& tc, const std::string& hd) {
  Pch p;
  if (any_pch_user && !opts.cache_dir.empty() && compiler_is_gcc(tc.cxx) && !std::getenv("CHROMA_NO_PCH")) {
    const std::string compile_cmd = tc.compile_command();
    chroma::detail::Sha256 h;
    h.update(compile_cmd.data(), compile_cmd.size());
    h.update(hd.data(), hd.size());
    p.dir = fs::path(opts.cache_dir) / "build" / "pch" / h.hex_digest().substr(0, 24);
    p.file = p.dir / (opts.pch_header + ".gch");
    p.pending = !fs::exists(p.file);
  }
  return p;
}

// The compile step: each unit in its own compiler process, at most `jobs` at a time, the
// precompiled header (when pending) first; units that use it wait until it is done (without
// it they still compile, only slower). Each finished object goes into the object cache, each
// process's wall time into `steps`. No new unit starts after a failure; run() throws the
// first failure's log once the running ones are reaped. Logs are written under `obj_dir`.
class CompileQueue {
 public:
  CompileQueue(const Toolchain& tc, const BuildOptions& opts, const fs::path& obj_dir, const fs::path& obj_cache,
               const std::vector<Unit>& units, Pch pch, std::vector<std::pair<std::string, double>>& steps)
      : tc_(tc), opts_(opts), obj_dir_(obj_dir), obj_cache_(obj_cache), units_(units), pch_(std::move(pch)),
        steps_(steps) {}

  void run(int jobs, bool tty);

 private:
  void start_pch();
  void start(size_t unit);
  void finish(size_t i, int status, bool tty);
  void wait_one(bool tty);

  const Toolchain& tc_;
  const BuildOptions& opts_;
  const fs::path obj_dir_, obj_cache_;
  const std::vector<Unit>& units_;
  Pch pch_;
  std::vector<std::pair<std::string, double>>& steps_;
  std::vector<Job> running_;
  size_t done_ = 0;
  std::string failure_;
  std::string pch_tmp_;
};

void CompileQueue::run(int jobs, bool tty) {
  if (pch_.pending) start_pch();
  size_t next = 0;
  while (next < units_.size() || !running_.empty()) {
    while (next < units_.size() && static_cast<int>(running_.size()) < jobs && failure_.empty() &&
           !(units_[next].pch && pch_.pending)) {
      start(next);
      ++next;
    }
    if (running_.empty()) break;
    wait_one(tty);
  }
  if (tty) std::fprintf(stderr, "\n");
  if (!failure_.empty()) throw CompileError("building the generated code: " + failure_);
}

void CompileQueue::start_pch() {
  std::error_code ec;
  fs::create_directories(pch_.file.parent_path(), ec);
  pch_tmp_ = pch_.file.string() + unique_suffix();
  std::vector<std::string> argv = {tc_.cxx};
  argv.insert(argv.end(), tc_.flags.begin(), tc_.flags.end());
  argv.insert(argv.end(), {"-x", "c++-header", (fs::path(opts_.include_dir) / opts_.pch_header).string(), "-o", pch_tmp_});
  Job j;
  j.name = opts_.pch_header;
  j.log = (obj_dir_ / "pch.log").string();
  j.pid = spawn(argv, j.log);
  j.unit = -1;
  running_.push_back(j);
}

void CompileQueue::start(size_t unit) {
  const Unit& u = units_[unit];
  std::vector<std::string> argv = {tc_.cxx};
  if (u.pch && !pch_.dir.empty() && fs::exists(pch_.file)) argv.push_back("-I" + pch_.dir.string());
  argv.insert(argv.end(), tc_.flags.begin(), tc_.flags.end());
  argv.insert(argv.end(), {"-c", u.src, "-o", u.obj});
  Job j;
  j.name = u.name;
  j.log = (obj_dir_ / (u.name + ".log")).string();
  j.pid = spawn(argv, j.log);
  j.unit = static_cast<int>(unit);
  running_.push_back(j);
}

void CompileQueue::finish(size_t i, int status, bool tty) {
  const bool ok = status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  Job j = running_[i];
  running_.erase(running_.begin() + static_cast<long>(i));
  steps_.emplace_back(j.name, std::chrono::duration<double>(std::chrono::steady_clock::now() - j.start).count());
  if (j.unit < 0) {  // the precompiled header: without it the files still compile, only slower
    std::error_code ec;
    if (ok) fs::rename(pch_tmp_, pch_.file, ec);
    if (!ok || ec) fs::remove(pch_tmp_, ec);
    pch_.pending = false;
    return;
  }
  const Unit& u = units_[static_cast<size_t>(j.unit)];
  ++done_;
  if (!ok && failure_.empty()) failure_ = "compiling " + u.name + " failed:\n" + read_text(j.log);
  if (ok && !u.cached_obj.empty()) {
    std::error_code ec;
    fs::create_directories(obj_cache_, ec);
    const std::string tmp = u.cached_obj + unique_suffix();
    fs::copy_file(u.obj, tmp, fs::copy_options::overwrite_existing, ec);
    if (!ec) fs::rename(tmp, u.cached_obj, ec);
    if (ec) fs::remove(tmp, ec);
  }
  if (tty) std::fprintf(stderr, "\r[chroma] compiled %zu/%zu %-24s", done_, units_.size(), u.name.c_str());
}

// Reaps one of this build's own compiler processes (never another child of the process: a
// second build in another thread, or the user's own subprocesses).
void CompileQueue::wait_one(bool tty) {
  int status = 0;
  for (;;) {
    for (size_t i = 0; i < running_.size(); ++i) {
      const pid_t pid = ::waitpid(running_[i].pid, &status, WNOHANG);
      if (pid == 0) continue;
      if (pid < 0 && errno == EINTR) continue;
      if (pid < 0) status = -1;  // lost (ECHILD: someone reaped it): count it as failed
      finish(i, status, tty);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Links `objects` into `library_path` (through a temporary file and a rename), its wall time
// into `steps`; throws with the linker's log when it fails.
void link_library(const Toolchain& tc, const std::vector<std::string>& objects, const std::string& library_path,
                  const fs::path& obj_dir, std::vector<std::pair<std::string, double>>& steps) {
  std::vector<std::string> argv = {tc.cxx};
  argv.insert(argv.end(), tc.env_flags.begin(), tc.env_flags.end());
  argv.insert(argv.end(), {"-shared", "-o"});
  const std::string tmp_lib = library_path + unique_suffix();
  argv.push_back(tmp_lib);
  argv.insert(argv.end(), objects.begin(), objects.end());
  argv.insert(argv.end(), tc.libs.begin(), tc.libs.end());
  const std::string log = (obj_dir / "link.log").string();
  const auto link_start = std::chrono::steady_clock::now();
  pid_t pid = spawn(argv, log);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  steps.emplace_back("link", std::chrono::duration<double>(std::chrono::steady_clock::now() - link_start).count());
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) throw CompileError("linking the generated code failed:\n" + read_text(log));
  fs::rename(tmp_lib, library_path);
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
  const Toolchain tc = toolchain(opts);
  const std::string hd = headers_key(opts);
  r.command = tc.command();
  r.cache_key = library_key(files, r.command, hd);
  // Named by content: the dynamic loader hands back an already loaded library for a path it
  // has seen, so recompiling another model into the same directory must give a new name.
  r.library_file = "model-" + r.cache_key.substr(0, 16) + ".so";
  r.library_path = (fs::path(out_dir) / r.library_file).string();

  const bool tty = isatty(2);
  fs::path cached;
  if (!opts.cache_dir.empty()) {
    cached = fs::path(opts.cache_dir) / "build" / (r.cache_key + ".so");
    if (fs::exists(cached)) {
      copy_by_rename(cached, r.library_path);
      r.cached = true;
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return r;
    }
  }

  const fs::path obj_dir = fs::path(out_dir) / (".build" + unique_suffix());
  fs::create_directories(obj_dir);
  const fs::path obj_cache = opts.cache_dir.empty() ? fs::path() : fs::path(opts.cache_dir) / "build" / "obj";
  const UnitPlan plan = plan_units(files, src_dir, obj_dir, obj_cache, tc.compile_command(), hd, opts.pch_header);
  const int jobs = opts.jobs > 0 ? opts.jobs : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  CompileQueue(tc, opts, obj_dir, obj_cache, plan.units, pch_location(plan.any_pch_user, opts, tc, hd), r.steps)
      .run(jobs, tty);
  link_library(tc, plan.objects, r.library_path, obj_dir, r.steps);
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
