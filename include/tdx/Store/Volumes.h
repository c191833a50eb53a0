//===- Volumes.h - the tensor store over the network --------------*- C++ -*-===//
//
// A networked tensor store is a list of volumes, one store process per host
// (tools/tdx-volume), named "ucx://h1:7070,h2:7070"; a key's path is
// "ucx://h1:7070,h2:7070/KEY", one version of it ".../KEY/step-00000003".
// No file system is shared:
//
//   - a version is a checkpoint (tdx/StateFormat/Checkpoint.h) whose files live
//     on volumes: each writing rank puts its file (its boxes of the state)
//     on the volume of its own host;
//   - the store's first volume is the key's home: it hands out versions,
//     holds each committed version's index (which names the volume of
//     every file) and commits a version by storing its index, whole, after
//     every file is in; a reader asks it for the newest index;
//   - a reader fetches the byte ranges of the boxes it asks for straight
//     from the volumes that hold them (one request per file and batch of
//     runs), every request naming the version, so a reader never mixes two;
//     a version its writer has dropped since (all but the newest `keep`
//     are) is reported stale, and the reader starts again on the newest.
//
// Every request carries the job's token (storeToken()); a volume started
// with one refuses a request without it, before reading or writing.
//
// The transport is UCX (tdx/Store/Ucx.h). A volume that does not answer
// in TDX_STORE_TIMEOUT seconds (default 10), or whose connection fails, is
// an error naming it and its host.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_STORE_VOLUMES_H
#define TDX_STORE_VOLUMES_H

#include "tdx/StateFormat/Checkpoint.h"

#include <functional>
#include <memory>
#include <stdexcept>

namespace tdx::rt {

/// Whether `path` names a networked store ("ucx://...").
bool isVolumePath(const std::string &path);

/// The state at `path`: a version of a networked store's key (its files read
/// from the volumes that hold them), or what TensorStore opens locally (a
/// safetensors file or folder, a checkpoint).
std::unique_ptr<TensorStore> openState(const std::string &path);

/// beginCheckpoint, writeCheckpointFile and commitCheckpoint
/// (tdx/StateFormat/Checkpoint.h) for a `root` that may also be a networked
/// store's key: its next version then goes to the volumes (each writer's
/// file to its own host's volume, the index to the key's home).
PendingCheckpoint beginVersion(const std::string &root, int64_t step);
std::string writeVersionFile(const PendingCheckpoint &pending, const std::string &file,
                             const std::vector<BoxToWrite> &boxes);
std::string commitVersion(const PendingCheckpoint &pending, const std::vector<std::string> &parts,
                          const std::map<std::string, std::string> &metadata, int keep);

/// A version a reader read from was dropped by its writer meanwhile: the
/// read starts again on the newest.
struct StaleVersion : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A committed version of a key: its path, index text and file opener.
struct VolumeVersion {
  std::string path, index;
  TensorStore::FileOpener open;
};
/// Calls `add` with the version `path` names (its newest, unless the path
/// names a step), again with the newest when a writer replaced it while it
/// was being opened.
void openVolumeVersion(const std::string &path,
                       const std::function<void(const VolumeVersion &)> &add);

/// Checkpoint.h's steps for a key of a networked store.
/// Version `step` (a checkpoint's training step), or with -1 the next.
PendingCheckpoint beginVolumeVersion(const std::string &root, int64_t step);
std::string putVolumeFile(const PendingCheckpoint &pending, const std::string &file,
                          const std::vector<BoxToWrite> &boxes);
std::string commitVolumeVersion(const PendingCheckpoint &pending, const std::string &index,
                                int keep);

/// The keys with a committed version, sorted.
std::vector<std::string> volumeKeys(const std::string &store);
/// The committed versions of `key`, oldest first (empty when none).
std::vector<int64_t> volumeVersions(const std::string &store, const std::string &key);
/// Deletes every version of `key` on every volume; throws when it has none.
void deleteVolumeKey(const std::string &store, const std::string &key);
/// What each volume holds: "host:port" -> its report (JSON text).
std::map<std::string, std::string> volumeStatus(const std::string &store);

/// The job's store token: TDX_STORE_TOKEN's value or, where that is an
/// absolute path, the first line of the file it names; empty when unset.
/// Throws when the file cannot be read or its first line is empty.
std::string storeToken();
/// Whether `given` is `token`, in a time that does not depend on where
/// they first differ.
bool tokenMatches(const std::string &token, const std::string &given);
/// One request to the volume "HOST:PORT", its header text sent as it is
/// (a JSON object gets the request's id): the reply's header (JSON text)
/// and payload, an error reply too. For tests that send what no client
/// would.
std::pair<std::string, std::string> volumeRequest(const std::string &volume,
                                                  const std::string &header,
                                                  const std::string &data);

} // namespace tdx::rt

#endif // TDX_STORE_VOLUMES_H
