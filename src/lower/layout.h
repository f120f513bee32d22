// Layout algebra: views as metadata. A Layout maps an index of `shape` to an element
// offset `offset + sum_k strides[k] * i_k` (strides in elements, 0 for broadcast dims).
// Every view op of the IR is a function Layout -> Layout; reshape may fail when the
// source strides cannot express the new shape (the caller then materializes a copy).
// The same algebra applies, with double coefficients, to Iota leaves.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ir/graph.h"

namespace chroma {

template <class T> struct BasicLayout {
  Shape shape;
  std::vector<T> strides;
  T offset{};
  bool operator==(const BasicLayout&) const = default;
};
using Layout = BasicLayout<int64_t>;

Layout contiguous_layout(const Shape& shape, int64_t offset = 0);
bool is_contiguous(const Layout& l);

// Channels-last strides of an [N, C, spatial...] shape (rank 3 to 5): the channel dimension
// innermost, then the spatial dimensions in order, the batch outermost (NHWC for 2-D images).
std::vector<int64_t> channels_last_strides(const Shape& shape);
// l addresses a channels-last tensor (at any offset; strides of extent-1 dims ignored).
bool is_channels_last(const Layout& l);

// The elements `l` addresses in `src` (each `elem_bytes` bytes), copied out densely: the
// dimensions in `order` (outermost first), dimension d over extent[d] values (an extent of 1
// where l broadcasts keeps that dimension once). dense_strides gives l's shape the strides
// over that copy (0 for those extent-1 dimensions).
std::vector<uint8_t> gather_strided(const uint8_t* src, size_t elem_bytes, const Layout& l, const Shape& extent,
                                    const std::vector<size_t>& order);
std::vector<int64_t> dense_strides(const Shape& extent, const std::vector<size_t>& order);

// Applies view node `n` (Permute, Expand, Slice or Reshape) to a layout of its input.
template <class T> std::optional<BasicLayout<T>> apply_view(const Node& n, const BasicLayout<T>& in);

}  // namespace chroma
