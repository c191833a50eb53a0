//===- Placement.h - layouts of global tensors over a mesh --------*- C++ -*-===//
//
// A layout is one DTensor placement per mesh axis; a rank holds the box of a
// global tensor its coordinates select (uneven splits as torch.chunk makes
// them). No MPI, no ATen: model binaries, checkpoints and the Python package
// compute boxes with the same code.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_PLACEMENT_H
#define TDX_RUNTIME_PLACEMENT_H

#include <cstdint>
#include <string>
#include <vector>

namespace tdx::rt {

/// One placement per mesh axis: {'S', dim}, {'R', 0}, {'P', reduce}, or
/// {'T', stage}: a pipeline stage's state on the pipeline axis, held by the
/// ranks at coordinate `stage` only (the others' box is empty; a 0-D state
/// they hold whole, unused): gathering and checkpoints read it from them.
struct Placement {
  char kind;
  int64_t value;
};
using Layout = std::vector<Placement>;
/// Parses "[Shard(0), Replicate, Partial(sum), Stage(1)]".
Layout parseLayout(const std::string &text);

enum Reduce : int64_t { Sum = 0, Avg = 1, Max = 2, Min = 3 };

/// The offsets and sizes of the box of `globalShape` that the device at
/// `coords` of a mesh of `meshShape` holds under `layout`. Throws when the
/// layout does not fit the mesh or the tensor.
void boxOf(const std::vector<int64_t> &meshShape, const std::vector<int64_t> &coords,
           const std::vector<int64_t> &globalShape, const Layout &layout,
           std::vector<int64_t> &offset, std::vector<int64_t> &size);

} // namespace tdx::rt

#endif // TDX_RUNTIME_PLACEMENT_H
