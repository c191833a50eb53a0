//===- Placement.cpp - layouts of global tensors over a mesh --------------===//

#include "tdx/Runtime/Placement.h"
#include "tdx/StateFormat/Box.h"

#include <stdexcept>

using namespace tdx::rt;

Layout tdx::rt::parseLayout(const std::string &text) {
  Layout out;
  size_t i = 0;
  while ((i = text.find_first_of("SRP", i)) != std::string::npos) {
    if (text.compare(i, 6, "Stage(") == 0) {
      out.push_back({'T', std::stoll(text.substr(i + 6))});
      i += 6;
    } else if (text.compare(i, 6, "Shard(") == 0) {
      out.push_back({'S', std::stoll(text.substr(i + 6))});
      i += 6;
    } else if (text.compare(i, 9, "Replicate") == 0) {
      out.push_back({'R', 0});
      i += 9;
    } else if (text.compare(i, 7, "Partial") == 0) {
      std::string rest = text.substr(i + 7, 6);
      int64_t r = rest.rfind("(max", 0) == 0   ? Max
                  : rest.rfind("(min", 0) == 0 ? Min
                  : rest.rfind("(avg", 0) == 0 ? Avg
                                               : Sum;
      out.push_back({'P', r});
      i += 7;
    } else {
      ++i;
    }
  }
  return out;
}

void tdx::rt::boxOf(const std::vector<int64_t> &meshShape, const std::vector<int64_t> &coords,
                    const std::vector<int64_t> &globalShape, const Layout &layout,
                    std::vector<int64_t> &offset, std::vector<int64_t> &size) {
  if (coords.size() != meshShape.size())
    throw std::invalid_argument("tdx: " + std::to_string(coords.size()) +
                                " coordinates for a mesh of " + std::to_string(meshShape.size()) +
                                " axes");
  offset.assign(globalShape.size(), 0);
  size = globalShape;
  bool elsewhere = false;
  for (size_t a = 0; a < layout.size() && a < meshShape.size(); ++a) {
    if (coords[a] < 0 || coords[a] >= meshShape[a])
      throw std::invalid_argument("tdx: coordinate " + std::to_string(coords[a]) +
                                  " is outside mesh axis " + std::to_string(a) + " of size " +
                                  std::to_string(meshShape[a]));
    // A pipeline stage's state: the other stages' ranks hold none of it
    // (a 0-D state, a few bytes, is held whole).
    if (layout[a].kind == 'T' && coords[a] != layout[a].value)
      elsewhere = true;
    if (layout[a].kind != 'S')
      continue;
    int64_t d = layout[a].value;
    if (d < 0 || d >= static_cast<int64_t>(globalShape.size()))
      throw std::invalid_argument("tdx: Shard(" + std::to_string(d) + ") of a tensor of rank " +
                                  std::to_string(globalShape.size()));
    auto [start, end] = chunkRange(size[d], meshShape[a], coords[a]);
    offset[d] += start;
    size[d] = end - start;
  }
  if (elsewhere && !size.empty())
    size[0] = 0;
}
