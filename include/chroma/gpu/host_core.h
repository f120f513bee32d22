// The replay core every GPU host library shares (the CUDA host, include/chroma/cuda/host.h;
// the Metal host, include/chroma/metal/host.h): the bookkeeping of the C ABI of host_abi.h,
// independent of the device API. A host keeps a `Core` of its buffer and kernel handles and
// asks it, for each call of the ABI, to check the caller's numbers before it touches the device:
//
//   chroma_<api>_buffer   -> add_buffer (after the device allocated it)
//   chroma_<api>_upload   -> check_upload
//   chroma_<api>_kernel   -> check_kernel_order, then add_kernel
//   chroma_<api>_entry    -> add_entry
//   chroma_<api>_dispatch -> append (every index checked; the dispatch's slots resolved to handles)
//   chroma_<api>_run      -> check_call (the entry, and every copy inside the arena), then the
//                            host copies the inputs, clears the status block, runs the entry's
//                            schedule, and copies the status block and the outputs back
//
// What differs per host is what it does on the device: how a dispatch runs (a CUDA launch with
// its arguments by pointer, or a library product; a Metal encoder's buffers and setBytes), how
// memory is copied, and what the host adds to a dispatch (`Extra`). Every function returns
// false with one line in `err` naming what the caller got wrong; none allocates on the device.
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "chroma/gpu/host_abi.h"

namespace chroma::gpu_host {

// One line into `err` (`errlen` bytes, NUL-terminated), printf style.
inline void say(char* err, size_t errlen, const char* fmt, ...) {
  if (err == nullptr || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

// `Buffer`, `Kernel`: the device API's handles (CUdeviceptr and CUfunction; MTL::Buffer* and
// MTL::ComputePipelineState*). `Extra`: what the host keeps with a dispatch besides the core's.
template <class Buffer, class Kernel, class Extra>
struct Core {
  struct Dispatch {
    int kernel = -1;                // index into `kernels`; -1: the host's own (a library product)
    Kernel fn{};
    unsigned gx = 0, gy = 0, threads = 0;
    std::vector<Buffer> slots;      // the storage slots' buffers, in slot order
    std::vector<unsigned> params;   // the parameter words
    Extra extra{};
  };

  std::vector<Buffer> buffers;          // buffers[0] is the arena (its status block included)
  std::vector<uint64_t> buffer_bytes;
  std::vector<Kernel> kernels;
  std::vector<unsigned> threads;        // per kernel: threads per block / threadgroup
  std::vector<std::vector<Dispatch>> entries;  // per entry point: its schedule

  int add_buffer(Buffer b, uint64_t bytes) {
    buffers.push_back(b);
    buffer_bytes.push_back(bytes);
    return static_cast<int>(buffers.size()) - 1;
  }

  bool check_upload(int id, uint64_t offset, uint64_t n, char* err, size_t errlen) const {
    if (id < 0 || static_cast<size_t>(id) >= buffers.size() || offset > buffer_bytes[static_cast<size_t>(id)] ||
        n > buffer_bytes[static_cast<size_t>(id)] - offset) {
      say(err, errlen, "upload of %llu bytes at %llu outside buffer %d", static_cast<unsigned long long>(n),
          static_cast<unsigned long long>(offset), id);
      return false;
    }
    return true;
  }

  // Kernels are added in the translation unit's order (chroma_k<index>_main).
  bool check_kernel_order(int index, char* err, size_t errlen) const {
    if (index != static_cast<int>(kernels.size())) {
      say(err, errlen, "kernels are made in order (expected %zu, got %d)", kernels.size(), index);
      return false;
    }
    return true;
  }

  void add_kernel(Kernel k, unsigned block) {
    kernels.push_back(k);
    threads.push_back(block);
  }

  int add_entry() {
    entries.emplace_back();
    return static_cast<int>(entries.size()) - 1;
  }

  bool check_entry(int entry, const char* what, char* err, size_t errlen) const {
    if (entry < 0 || static_cast<size_t>(entry) >= entries.size()) {
      say(err, errlen, "%s for entry %d, which has not been made (%zu entries)", what, entry, entries.size());
      return false;
    }
    return true;
  }

  bool check_buffer(int id, const char* what, int which, char* err, size_t errlen) const {
    if (id < 0 || static_cast<size_t>(id) >= buffers.size()) {
      say(err, errlen, "%s %d names buffer %d (%zu buffers)", what, which, id, buffers.size());
      return false;
    }
    return true;
  }

  // Appends kernel `kernel` on a gx x gy grid, storage slot s bound to buffer slot_buffers[s],
  // then `nparams` parameter words, to entry `entry`'s schedule. Returns the stored dispatch
  // (the host adds its `extra`), or null with the reason in `err`.
  Dispatch* append(int entry, int kernel, unsigned gx, unsigned gy, int nslots, const int* slot_buffers, int nparams,
                   const unsigned* params, char* err, size_t errlen) {
    if (!check_entry(entry, "dispatch", err, errlen)) return nullptr;
    std::vector<Dispatch>& schedule = entries[static_cast<size_t>(entry)];
    if (kernel < 0 || static_cast<size_t>(kernel) >= kernels.size()) {
      say(err, errlen, "dispatch %zu: no kernel %d (%zu kernels)", schedule.size(), kernel, kernels.size());
      return nullptr;
    }
    if (nslots < 0 || nparams < 0) {
      say(err, errlen, "dispatch %zu: %d slots and %d parameter words", schedule.size(), nslots, nparams);
      return nullptr;
    }
    Dispatch d;
    d.kernel = kernel;
    d.fn = kernels[static_cast<size_t>(kernel)];
    d.gx = gx;
    d.gy = gy;
    d.threads = threads[static_cast<size_t>(kernel)];
    for (int s = 0; s < nslots; ++s) {
      if (slot_buffers[s] < 0 || static_cast<size_t>(slot_buffers[s]) >= buffers.size()) {
        say(err, errlen, "dispatch %zu: slot %d names buffer %d", schedule.size(), s, slot_buffers[s]);
        return nullptr;
      }
      d.slots.push_back(buffers[static_cast<size_t>(slot_buffers[s])]);
    }
    d.params.assign(params, params + nparams);
    schedule.push_back(std::move(d));
    return &schedule.back();
  }

  // A call's entry, and every copy it asks for inside the arena (buffers[0]): the inputs, the
  // outputs and the status block. `device_io`: whether inputs and outputs may be device
  // addresses (CUDA's); a host without them refuses such a call.
  bool check_call(const ChromaGpuCall& c, bool device_io, char* err, size_t errlen) const {
    if (buffers.empty()) {
      say(err, errlen, "no arena buffer: no buffer has been made");
      return false;
    }
    if (!check_entry(c.entry, "call", err, errlen)) return false;
    const uint64_t size = buffer_bytes[0];
    auto inside = [&](uint64_t off, uint64_t n) { return off <= size && n <= size - off; };
    for (int i = 0; i < c.n_in; ++i) {
      if ((c.in_device[i] && !device_io) || !inside(c.in_offset[i], c.in_bytes[i])) {
        say(err, errlen, "input %d: %s", i, c.in_device[i] && !device_io ? "device inputs are CUDA's" : "outside the arena");
        return false;
      }
    }
    for (int i = 0; i < c.n_out; ++i) {
      if ((c.out_device[i] && !device_io) || !inside(c.out_offset[i], c.out_bytes[i])) {
        say(err, errlen, "output %d: %s", i, c.out_device[i] && !device_io ? "device outputs are CUDA's" : "outside the arena");
        return false;
      }
    }
    if (!inside(c.status_offset, c.status_bytes)) {
      say(err, errlen, "the status block (%llu bytes at %llu) lies outside the arena (%llu bytes)",
          static_cast<unsigned long long>(c.status_bytes), static_cast<unsigned long long>(c.status_offset),
          static_cast<unsigned long long>(size));
      return false;
    }
    return true;
  }
};

}  // namespace chroma::gpu_host
