// Importer: reads a Chroma graph file (docs/graph_format.md) and builds the IR.
//
// Before building anything it checks every node's ATen target against the handler table
// and reports ALL unsupported ops at once, each with the user's source line. Any other
// problem (a malformed file, a shape the handler rejects) raises CompileError naming the
// node and its source line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace chroma {

Graph import_graph_file(const std::string& path);
// The same from bytes in memory; `name` is used in messages. Never crashes on malformed
// input: every problem is a CompileError naming the field or node (the fuzz target's entry).
Graph import_graph_bytes(const uint8_t* bytes, size_t size, const std::string& name);

// ATen targets the importer handles (sorted), for docs and tests.
std::vector<std::string> supported_aten_targets();

// Why an ATen target cannot be compiled by design (random numbers, data-dependent shapes,
// complex numbers), or "" when nothing rules it out.
std::string refusal(const std::string& target);

}  // namespace chroma
