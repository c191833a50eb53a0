//===- VocabParallel.h - per-rank programs of vocab-split ops ----*- C++ -*-===//
//
// The local computation of an embedding whose table is split by rows, and of
// a cross-entropy whose classes are split, over one mesh axis. Both leave a
// Partial sum, which tdx-insert-collectives turns into one all_reduce where
// a replicated value is needed; the cross-entropy also reduces the max and
// the sum of exponentials across the axis itself (the math needs them).
//
//===----------------------------------------------------------------------===//

#ifndef TDX_SHARDING_VOCABPARALLEL_H
#define TDX_SHARDING_VOCABPARALLEL_H

#include "tdx/Dialect/TdxOps.h"

namespace mlir::tdx {

/// Replaces `op` (already retyped to local types) by a masked lookup of the
/// ids this rank's rows hold; `vocab` is the global row count, split over
/// `axis` of `mesh`. Returns the replacement value.
FailureOr<Value> lowerVocabParallelEmbedding(OpBuilder &b, EmbeddingOp op, MeshOp mesh,
                                             int64_t axis, int64_t vocab);

/// Replaces `op` (already retyped) by the vocab-parallel cross-entropy over
/// `classes` global classes split over `axis`.
FailureOr<Value> lowerVocabParallelCrossEntropy(OpBuilder &b, CrossEntropyOp op, MeshOp mesh,
                                                int64_t axis, int64_t classes);

} // namespace mlir::tdx

#endif // TDX_SHARDING_VOCABPARALLEL_H
