#include "ir/spill.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "ir/dtype.h"

namespace chroma {

struct SpillFile::Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

SpillFile::SpillFile(const std::string& dir, int64_t after_bytes, int64_t min_bytes)
    : fd_(std::make_shared<Fd>()), dir_(dir), after_(after_bytes), min_(min_bytes) {}

void SpillFile::open() {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  const std::string pattern = dir_ + "/.chroma-spill-XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  fd_->fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd_->fd < 0) {
    throw CompileError("cannot create the compile's scratch file in '" + dir_ + "': " + std::strerror(errno));
  }
  path_ = name.data();
  ::unlink(path_.c_str());  // gone with the descriptor, whatever happens to the process
}

SpillFile::~SpillFile() = default;

int64_t SpillFile::spilled_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spilled_;
}

int64_t SpillFile::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_;
}

BlobPtr SpillFile::put(std::vector<uint8_t> bytes) {
  const int64_t n = static_cast<int64_t>(bytes.size());
  int64_t at = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (n == 0 || n < min_ || kept_ + n <= after_) {
      kept_ += n;
      return make_blob(std::move(bytes));
    }
    if (fd_->fd < 0) open();
    const int64_t page = ::sysconf(_SC_PAGESIZE);
    at = end_;
    end_ += (n + page - 1) / page * page;  // each tensor on its own pages: mmap's offsets
    spilled_ += n;
  }
  for (int64_t done = 0; done < n;) {
    const ssize_t w = ::pwrite(fd_->fd, bytes.data() + done, static_cast<size_t>(n - done), at + done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      throw CompileError("cannot write " + std::to_string(n) + " bytes to the compile's scratch file '" + path_ +
                         "': " + std::strerror(w < 0 ? errno : ENOSPC));
    }
    done += w;
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(n), PROT_READ, MAP_SHARED, fd_->fd, at);
  if (p == MAP_FAILED) {
    throw CompileError("cannot map the compile's scratch file '" + path_ + "': " + std::strerror(errno));
  }
  std::vector<uint8_t>().swap(bytes);  // the memory copy goes now
  auto keep_fd = fd_;
  std::shared_ptr<const void> keep(p, [n, keep_fd](const void* q) { ::munmap(const_cast<void*>(q), static_cast<size_t>(n)); });
  return std::make_shared<const Blob>(std::move(keep), static_cast<const uint8_t*>(p), static_cast<size_t>(n));
}

}  // namespace chroma
