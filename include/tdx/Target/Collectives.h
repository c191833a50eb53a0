//===- Collectives.h - the collectives a partitioned program runs -*- C++ -*-===//
//
// What tdx-comm-report prints and tdx-explain draws: each collective of a
// partitioned module with its mesh axes, group, payload, element type and
// seconds by the cost model.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_TARGET_COLLECTIVES_H
#define TDX_TARGET_COLLECTIVES_H

#include "mlir/IR/BuiltinOps.h"

#include <optional>
#include <string>
#include <vector>

namespace mlir::tdx {

struct CollectiveUse {
  Operation *op;
  std::string kind;     // "all_gather", "all_reduce", ...
  std::vector<std::string> axes;
  int64_t groupSize = 1; // ranks in its group
  int64_t bytes = 0;     // the payload a rank passes in (-1: not static)
  std::string dtype;     // its element type ("f32", "bf16")
  std::string location;  // file:line:col, or the location printed
  double seconds = 0;    // by the cost model's defaults (collectiveSeconds)
};

/// `op`'s use, if it is a collective with a mesh and axes.
std::optional<CollectiveUse> collectiveUse(Operation *op);
/// Its `seconds` alone (no names and locations written: the passes that
/// price ops call it often).
std::optional<double> collectiveOpSeconds(Operation *op);
/// The collectives of `root` in program order (inside tdx.start too).
std::vector<CollectiveUse> collectivesIn(Operation *root);

} // namespace mlir::tdx

#endif // TDX_TARGET_COLLECTIVES_H
