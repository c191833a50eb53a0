//===- Safetensors.h - checked safetensors files for model binaries -*- C++ -*-===//
//
// The tensor files of model binaries (--inputs, --outputs, --params,
// --dump-params, checkpoints) without ATen, so the CPU and the CUDA runtime read and write
// them the same way. A reader validates the header (sizes, offsets, dtypes)
// before any data is read and can read one rank's box of an entry alone, so
// a rank never holds a global parameter it only needs a shard of.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_STATEFORMAT_SAFETENSORS_H
#define TDX_STATEFORMAT_SAFETENSORS_H

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tdx::rt {

/// Element types of stored tensors (tdx/StateFormat/DTypes.def).
enum class DType {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir, ir, runs) Name,
#include "tdx/StateFormat/DTypes.def"
};
int64_t dtypeSize(DType t);
/// The safetensors name ("F32", "BOOL").
const char *dtypeName(DType t);
/// The enumerator's name ("F32", "Bool"): emitted sources spell it so.
const char *dtypeEnumerator(DType t);
/// Throws naming the dtype when it is not one of the above.
DType dtypeNamed(const std::string &name);

/// A stored box of a global tensor: the whole tensor in a plain safetensors
/// file, one rank's box in a checkpoint (tdx/StateFormat/Checkpoint.h).
struct StoredChunk {
  std::string file;
  /// Byte offset of the box's (dense, row-major) data in `file`.
  uint64_t dataOffset = 0;
  std::vector<int64_t> offset, shape;
  /// The checksum of the box's bytes, when the index records one.
  bool hasCrc = false;
  uint32_t crc = 0;
  int64_t numel() const;
};

struct StoredTensor {
  DType dtype;
  /// The global shape.
  std::vector<int64_t> shape;
  /// They tile the tensor exactly (checked when the store is opened).
  std::vector<StoredChunk> chunks;
  int64_t numel() const;
};

/// The tensors of one safetensors file, of every *.safetensors file of a
/// directory (a checkpoint split in several files, as Hugging Face writes
/// them; a name in two files is an error), or of a tdx checkpoint (a step
/// directory with tdx.index.json, or a root whose LATEST names one), or of
/// a version of a networked store's key, its files read from the volumes
/// that hold them (made by openState, tdx/Store/Volumes.h, which opens a
/// local path or a key alike; the path constructor refuses a key).
/// Throws with the path on a missing, truncated or corrupt file.
class TensorStore {
public:
  explicit TensorStore(const std::string &path);
  /// The path opened (for a checkpoint root, the step directory).
  const std::string &path() const { return path_; }
  /// nullptr when absent.
  const StoredTensor *find(const std::string &name) const;
  /// The entry `name` (a `what`: "parameter", "input") of global `shape`;
  /// throws naming the file when it is absent or has another shape.
  const StoredTensor &expect(const std::string &name, const std::string &what,
                             const std::vector<int64_t> &shape) const;
  /// Every tensor by name.
  const std::map<std::string, StoredTensor> &tensors() const { return entries_; }
  /// A checkpoint's metadata ("step", "seed", ...); empty for plain files.
  const std::map<std::string, std::string> &metadata() const { return metadata_; }
  /// Reads the whole tensor into `out` (numel * dtypeSize bytes).
  void read(const std::string &name, void *out) const;
  /// Reads the box [offset, offset + size) of the tensor, row-major, into
  /// `out`: only the bytes of the box are read, from the chunks that hold
  /// them. A chunk read whole is checked against its checksum.
  void readBox(const std::string &name, const std::vector<int64_t> &offset,
               const std::vector<int64_t> &size, void *out) const;
  /// Tensor bytes read so far (headers and the index not counted).
  uint64_t bytesRead() const { return bytesRead_; }

  /// A file of the store, read at offsets: a local file, or one on a
  /// volume. Reads come from the file as it was when the store was opened
  /// (a local file is kept open even if a writer deletes it meanwhile).
  class OpenFile {
  public:
    virtual ~OpenFile() = default;
    virtual uint64_t size() const = 0;
    /// Reads exactly `n` bytes at `offset` or throws.
    virtual void read(uint64_t offset, uint64_t n, void *out) const = 0;
    struct Run {
      uint64_t offset, bytes;
      char *dst;
      /// With `checksum`, the run's CRC-32C.
      uint32_t crc;
    };
    /// Reads every run: by default several reads in flight when there are
    /// many runs or many bytes.
    virtual void readRuns(std::vector<Run> &runs, bool checksum) const;
  };
  /// Opens file `name` of a checkpoint; `size` is what the index says.
  using FileOpener =
      std::function<std::shared_ptr<const OpenFile>(const std::string &name, uint64_t size)>;

  /// The checkpoint whose index (tdx.index.json's text) is `index`, its
  /// files opened by `open`; `path` names it in errors.
  TensorStore(std::string path, const std::string &index, const FileOpener &open);

private:
  mutable uint64_t bytesRead_ = 0;
  std::string path_;
  std::map<std::string, StoredTensor> entries_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, std::shared_ptr<const OpenFile>> files_;
  struct SafetensorsHeader addOpened(const std::string &file, std::shared_ptr<const OpenFile> f);
  void addFile(const std::string &file);
  void addCheckpoint(const std::string &dir);
  void addIndex(const std::string &where, const std::string &prefix, const std::string &text,
                const FileOpener &open);
};

/// The local file `path`, opened for a TensorStore.
std::shared_ptr<const TensorStore::OpenFile> openLocalFile(const std::string &path);

/// A parsed, checked safetensors header: entries with absolute data offsets.
struct SafetensorsHeader {
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t dataOffset;
  };
  std::map<std::string, Entry> entries;
  std::map<std::string, std::string> metadata;
};

/// The header of `bytes`, a whole safetensors file in memory; throws naming
/// `file` when it is not one (truncated, a header that does not parse, data
/// offsets past its end or not matching a tensor's shape).
SafetensorsHeader checkSafetensors(const std::string &bytes, const std::string &file);

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void *data;
};
/// What writeSafetensorsFile wrote: the file's size and checksum, and each
/// tensor's data checksum.
struct WrittenFile {
  uint64_t size = 0;
  uint32_t crc = 0;
  std::vector<uint32_t> tensorCrcs;
};
/// Writes `path` (no temporary file): the header, padded so the data starts
/// 64-byte aligned, then the tensors' data in order; `metadata` becomes the
/// header's __metadata__. With `sync` the file is on disk (fsync) when this
/// returns. Throws naming the file on any failed write.
WrittenFile writeSafetensorsFile(const std::string &path, const std::vector<TensorToWrite> &tensors,
                                 const std::map<std::string, std::string> &metadata, bool sync);
/// The bytes writeSafetensorsFile writes, in memory.
std::string serializeSafetensors(const std::vector<TensorToWrite> &tensors,
                                 const std::map<std::string, std::string> &metadata,
                                 WrittenFile &written);
/// Writes a temporary file and renames it over `path`: a reader never sees
/// half a file, and a failed write leaves what was there.
void writeSafetensors(const std::string &path, const std::vector<TensorToWrite> &tensors);

} // namespace tdx::rt

#endif // TDX_STATEFORMAT_SAFETENSORS_H
