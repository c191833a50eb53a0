//===- Checkpoint.h - sharded, crash-safe checkpoints ------------*- C++ -*-===//
//
// A checkpoint root holds one directory per saved step and a file LATEST
// naming the newest committed one:
//
//   root/LATEST                      "step-00000010\n"
//   root/step-00000010/tdx.index.json
//   root/step-00000010/rank-00003.safetensors
//
// Each writing rank stores its boxes of the state in one safetensors file
// (the tensors under their global names, shaped as the box; the header's
// __metadata__ names the checkpoint and the file, so a file copied in from
// elsewhere is caught). A replicated box is written by one of the ranks that
// hold it, spread over them. tdx.index.json, written last, gives every
// tensor's dtype, global shape and the chunks (file, offset, shape, CRC-32C)
// that tile it, and every file's size and CRC-32C.
//
// Commit: the files are written into root/.step-N.tmp and fsynced; rank 0
// writes the index (temporary name, fsync, rename), fsyncs the directory,
// renames it to root/step-N, fsyncs the root, then replaces LATEST the same
// way; only then are older steps deleted. A crash at any point leaves the
// previous checkpoint committed and the new one complete or invisible.
//
// A networked tensor store's version (tdx/Store/Volumes.h) is the same
// checkpoint with its files on volumes: beginVersion, writeVersionFile and
// commitVersion there take a root "ucx://h1:7070,h2:7070/KEY" too, sending
// each writer's file to its host's volume and the index to the store's
// first volume, which commits it; the functions here write local folders.
//
// No MPI and no ATen here: model binaries (through Mesh.h's saveCheckpoint)
// and the Python package write and read checkpoints with this code;
// TensorStore (Safetensors.h) reads them.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_STATEFORMAT_CHECKPOINT_H
#define TDX_STATEFORMAT_CHECKPOINT_H

#include "tdx/StateFormat/Safetensors.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tdx::rt {

/// "step-00000010".
std::string stepDirName(int64_t step);

/// Whether `path` is a checkpoint step directory or a checkpoint root.
bool isCheckpoint(const std::string &path);

/// The committed step directory `path` names: `path` itself when it holds
/// tdx.index.json, else the step a root's LATEST names (or, without LATEST,
/// its newest complete step). Throws when there is none.
std::string resolveCheckpoint(const std::string &path);

/// One past the newest step of the root `root` (0 when it has none): the
/// next version of a tensor store's key.
int64_t nextStep(const std::string &root);

/// The checkpoint root of `key` in the tensor store at `store` (a directory
/// per key, its steps the key's versions). Throws unless the key is a name
/// of letters, digits, '.', '_' and '-' that does not start with '.'.
std::string storeKeyPath(const std::string &store, const std::string &key);

/// A checkpoint being written.
struct PendingCheckpoint {
  std::string root, tmp, id;
  int64_t step = 0;
};

/// Starts step `step` (-1: the next) under `root` (made if missing): an
/// empty temporary directory (a leftover of a crashed save is removed) and
/// a fresh id. One process (rank 0) calls it; the writers then get `tmp`
/// and `id`.
PendingCheckpoint beginCheckpoint(const std::string &root, int64_t step);

/// One box of a global tensor, dense and row-major.
struct BoxToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> globalShape, offset, shape;
  const void *data;
};

/// Writes `file` into the pending checkpoint's directory with `boxes` and
/// fsyncs it. Returns its part of the
/// index (JSON text) for commitCheckpoint.
std::string writeCheckpointFile(const PendingCheckpoint &pending, const std::string &file,
                                const std::vector<BoxToWrite> &boxes);
/// The tensors of a file of `boxes`, and its part of the index once written.
std::vector<TensorToWrite> checkpointTensors(const std::vector<BoxToWrite> &boxes);
/// `volume` names the networked store's volume that holds the file.
std::string checkpointPart(const std::string &file, const WrittenFile &written,
                           const std::vector<BoxToWrite> &boxes, const std::string &volume = "");
/// A fresh id for step `step` ("step-00000003-<random>"), which every file's
/// header repeats: a file of another checkpoint is caught.
std::string newCheckpointId(int64_t step);
/// The index (tdx.index.json's text) of the writers' parts; throws unless
/// the chunks tile every tensor exactly.
std::string checkpointIndex(const PendingCheckpoint &pending, const std::vector<std::string> &parts,
                            const std::map<std::string, std::string> &metadata);

/// Commits the pending checkpoint from every writer's part of the index
/// (parts may be empty: a rank that wrote nothing): checks that the chunks
/// tile every tensor exactly, writes the index with `metadata`, commits the
/// directory and LATEST as above, then deletes all but the newest `keep`
/// steps (0 keeps all) and leftovers of crashed saves. Returns the step
/// directory.
std::string commitCheckpoint(const PendingCheckpoint &pending,
                             const std::vector<std::string> &parts,
                             const std::map<std::string, std::string> &metadata, int keep);

/// Reads every byte of every file of the checkpoint `path` names and checks
/// it against the index (sizes, CRC-32C of files and chunks, tiling).
/// Throws naming the file, tensor and offset of the first mismatch; returns
/// the number of bytes checked.
uint64_t verifyCheckpoint(const std::string &path);

/// Throws unless `chunks` tile a tensor of `shape` exactly (in bounds, no
/// overlap, nothing missing); `where` names the checkpoint.
void checkTiling(const std::string &where, const std::string &name,
                 const std::vector<int64_t> &shape, const std::vector<StoredChunk> &chunks);

} // namespace tdx::rt

#endif // TDX_STATEFORMAT_CHECKPOINT_H
