// Importer: reads a Chroma graph file (docs/graph_format.md) and builds the IR.
//
// Before building anything it checks every node's ATen target against the handler table
// and reports ALL unsupported ops at once, each with the user's source line. Any other
// problem (a malformed file, a shape the handler rejects) raises CompileError naming the
// node and its source line.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace chroma {

Graph import_graph_file(const std::string& path);

// ATen targets the importer handles (sorted), for docs and tests.
std::vector<std::string> supported_aten_targets();

// Why an ATen target cannot be compiled by design (random numbers, data-dependent shapes,
// complex numbers), or "" when nothing rules it out.
std::string refusal(const std::string& target);

}  // namespace chroma
