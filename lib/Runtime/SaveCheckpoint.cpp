//===- SaveCheckpoint.cpp - every rank's part of a checkpoint, committed --===//

#include "tdx/StateFormat/Checkpoint.h"
#include "tdx/Store/Volumes.h"
#include "tdx/Runtime/Mesh.h"

#include <mpi.h>

#include <cstdio>
#include <stdexcept>

using namespace tdx::rt;

namespace {

/// Rank 0's `text` on every rank.
std::string broadcast(Mesh &mesh, std::string text) {
  int64_t size = static_cast<int64_t>(text.size());
  MPI_Request request;
  checkMpi(MPI_Ibcast(&size, 1, MPI_INT64_T, 0, MPI_COMM_WORLD, &request), "checkpoint");
  mesh.complete(&request, "checkpoint", {});
  text.resize(static_cast<size_t>(size));
  checkMpi(MPI_Ibcast(text.data(), static_cast<int>(size), MPI_CHAR, 0, MPI_COMM_WORLD, &request),
           "checkpoint");
  mesh.complete(&request, "checkpoint", {});
  return text;
}

/// Every rank's `text` on rank 0 (empty elsewhere).
std::vector<std::string> gatherText(Mesh &mesh, const std::string &text) {
  int world = mesh.worldSize();
  int size = static_cast<int>(text.size());
  std::vector<int> sizes(world), displs(world);
  MPI_Request request;
  checkMpi(MPI_Igather(&size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, MPI_COMM_WORLD, &request),
           "checkpoint");
  mesh.complete(&request, "checkpoint", {});
  int total = 0;
  for (int r = 0; r < world; ++r)
    displs[r] = total, total += sizes[r];
  std::string all(mesh.rank() == 0 ? total : 0, '\0');
  checkMpi(MPI_Igatherv(text.data(), size, MPI_CHAR, all.data(), sizes.data(), displs.data(),
                        MPI_CHAR, 0, MPI_COMM_WORLD, &request),
           "checkpoint");
  mesh.complete(&request, "checkpoint", {});
  std::vector<std::string> out;
  if (mesh.rank() == 0)
    for (int r = 0; r < world; ++r)
      out.push_back(all.substr(displs[r], sizes[r]));
  return out;
}

/// Whether this rank writes tensor `index` of layout `layout`: of the ranks
/// holding its box (they differ only on replicated axes), the one whose
/// index over those axes is `index` modulo their number.
bool owns(const Mesh &mesh, const std::string &name, const Layout &layout, size_t index) {
  int64_t group = 1, position = 0;
  for (size_t a = 0; a < mesh.meshShape().size(); ++a) {
    char kind = a < layout.size() ? layout[a].kind : 'R';
    if (kind == 'P')
      throw std::runtime_error("tdx: cannot checkpoint '" + name +
                               "': its layout is Partial (a state is stored reduced)");
    // A pipeline stage's state is written by that stage's ranks.
    if (kind == 'T' && mesh.coords()[a] != layout[a].value)
      return false;
    if (kind == 'R')
      position = position * mesh.meshShape()[a] + mesh.coords()[a], group *= mesh.meshShape()[a];
  }
  return position == static_cast<int64_t>(index) % group;
}

} // namespace

std::string tdx::rt::saveCheckpoint(Mesh &mesh, const std::string &root, int64_t step,
                                    const std::vector<LocalTensor> &state,
                                    const std::map<std::string, std::string> &metadata, int keep) {
  PendingCheckpoint pending;
  if (mesh.rank() == 0)
    pending = beginVersion(root, step);
  step = std::stoll(broadcast(mesh, std::to_string(pending.step)));
  pending.root = root;
  pending.step = step;
  pending.tmp = broadcast(mesh, pending.tmp);
  pending.id = broadcast(mesh, pending.id);
  std::vector<BoxToWrite> boxes;
  for (size_t i = 0; i < state.size(); ++i) {
    const LocalTensor &t = state[i];
    if (!owns(mesh, t.name, t.layout, i))
      continue;
    BoxToWrite box{t.name, t.dtype, t.globalShape, {}, {}, t.data};
    mesh.box(t.globalShape, t.layout, box.offset, box.shape);
    int64_t numel = 1, global = 1;
    for (size_t d = 0; d < box.shape.size(); ++d)
      numel *= box.shape[d], global *= t.globalShape[d];
    // An empty box of an uneven split adds nothing; an empty tensor is
    // still listed (by its one owner).
    if (numel > 0 || global == 0)
      boxes.push_back(std::move(box));
  }
  std::string part;
  if (!boxes.empty()) {
    char file[32];
    std::snprintf(file, sizeof file, "rank-%05d.safetensors", mesh.rank());
    part = writeVersionFile(pending, file, boxes);
  }
  std::vector<std::string> parts = gatherText(mesh, part);
  std::string dir;
  if (mesh.rank() == 0)
    dir = commitVersion(pending, parts, metadata, keep);
  mesh.barrier();
  return broadcast(mesh, dir);
}
