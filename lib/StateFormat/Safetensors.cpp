//===- Safetensors.cpp - checked safetensors files for model binaries -----===//

#include "tdx/StateFormat/Safetensors.h"
#include "tdx/StateFormat/Box.h"
#include "tdx/StateFormat/Crc32c.h"

#include "tdx/StateFormat/Json.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

using namespace tdx::rt;

namespace {

const std::pair<const char *, DType> kDtypes[] = {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir, ir, runs) {stored, DType::Name},
#include "tdx/StateFormat/DTypes.def"
};

std::runtime_error error(const std::string &what) { return std::runtime_error("tdx: " + what); }

/// Reads in flight at once; how many runs and bytes are issued together;
/// the largest single read.
constexpr size_t kReadThreads = 4, kRunBatch = 4096;
constexpr uint64_t kReadPiece = 1 << 20, kBatchBytes = 64ull << 20;

} // namespace

/// A local file open for reading at offsets.
class LocalFile final : public TensorStore::OpenFile {
public:
  explicit LocalFile(const std::string &path)
      : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0)
      throw error("cannot open " + path);
  }
  ~LocalFile() override { ::close(fd_); }
  LocalFile(const LocalFile &) = delete;
  LocalFile &operator=(const LocalFile &) = delete;
  uint64_t size() const override {
    struct stat st;
    return ::fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }
  void read(uint64_t offset, uint64_t n, void *out) const override {
    char *dst = static_cast<char *>(out);
    while (n > 0) {
      ssize_t got = ::pread(fd_, dst, n, static_cast<off_t>(offset));
      if (got <= 0)
        throw error(path_ + " is truncated");
      dst += got, offset += static_cast<uint64_t>(got), n -= static_cast<uint64_t>(got);
    }
  }

private:
  std::string path_;
  int fd_;
};

void TensorStore::OpenFile::readRuns(std::vector<Run> &runs, bool checksum) const {
  uint64_t bytes = 0;
  for (const Run &r : runs)
    bytes += r.bytes;
  size_t threads =
      runs.size() >= 256 || bytes >= 2 * kReadPiece ? std::min(kReadThreads, runs.size()) : 1;
  std::vector<std::exception_ptr> failed(threads);
  auto readPart = [&](size_t t) {
    try {
      for (size_t i = t; i < runs.size(); i += threads) {
        read(runs[i].offset, runs[i].bytes, runs[i].dst);
        if (checksum)
          runs[i].crc = crc32c(runs[i].dst, runs[i].bytes);
      }
    } catch (...) {
      failed[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t)
    pool.emplace_back(readPart, t);
  readPart(0);
  for (std::thread &t : pool)
    t.join();
  for (const std::exception_ptr &e : failed)
    if (e)
      std::rethrow_exception(e);
}

using File = TensorStore::OpenFile;

std::shared_ptr<const File> tdx::rt::openLocalFile(const std::string &path) {
  return std::make_shared<const LocalFile>(path);
}

int64_t tdx::rt::dtypeSize(DType t) {
  switch (t) {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir, ir, runs)                                  \
  case DType::Name:                                                                        \
    return bytes;
#include "tdx/StateFormat/DTypes.def"
  }
  return 0;
}

const char *tdx::rt::dtypeEnumerator(DType t) {
  switch (t) {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir, ir, runs)                                  \
  case DType::Name:                                                                        \
    return #Name;
#include "tdx/StateFormat/DTypes.def"
  }
  return "?";
}

const char *tdx::rt::dtypeName(DType t) {
  for (const auto &[name, type] : kDtypes)
    if (type == t)
      return name;
  return "?";
}

DType tdx::rt::dtypeNamed(const std::string &name) {
  for (const auto &[n, type] : kDtypes)
    if (name == n)
      return type;
  throw error("unsupported safetensors dtype " + name +
              " (model binaries store F32, F64, F16, BF16, I64, I32 and BOOL)");
}

namespace {
int64_t product(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// Writes all of `n` bytes or throws.
void writeAll(int fd, const std::string &path, const void *data, uint64_t n) {
  const char *p = static_cast<const char *>(data);
  while (n > 0) {
    ssize_t put = ::write(fd, p, std::min<uint64_t>(n, 1u << 30));
    if (put <= 0)
      throw error("cannot write " + path + " (disk full or not writable?)");
    p += put, n -= static_cast<uint64_t>(put);
  }
}
} // namespace

int64_t StoredChunk::numel() const { return product(shape); }
int64_t StoredTensor::numel() const { return product(shape); }

namespace {
SafetensorsHeader parseHeader(const File &in, const std::string &file) {
  SafetensorsHeader out;
  uint64_t fileSize = in.size(), headerSize = 0;
  if (fileSize < 8)
    throw error(file + " is not a safetensors file (shorter than 8 bytes)");
  in.read(0, 8, &headerSize);
  if (headerSize == 0 || headerSize > fileSize - 8)
    throw error(file + " is not a safetensors file (bad header size; truncated?)");
  std::string header(headerSize, '\0');
  in.read(8, headerSize, header.data());
  std::optional<json::Value> json = json::parse(header);
  const json::Object *root = json ? json->getAsObject() : nullptr;
  if (!root)
    throw error(file + " has a corrupt safetensors header");
  uint64_t dataStart = 8 + headerSize, dataSize = fileSize - dataStart;
  for (const auto &[key, value] : *root) {
    if (key == "__metadata__") {
      if (const json::Object *meta = value.getAsObject())
        for (const auto &[k, v] : *meta)
          if (std::optional<std::string> text = v.getAsString())
            out.metadata[k] = (*text);
      continue;
    }
    const json::Object *entry = value.getAsObject();
    const json::Array *shape = entry ? entry->getArray("shape") : nullptr;
    const json::Array *offsets = entry ? entry->getArray("data_offsets") : nullptr;
    std::optional<std::string> dtype = entry ? entry->getString("dtype") : std::nullopt;
    if (!shape || !offsets || offsets->size() != 2 || !dtype)
      throw error(file + ": entry " + key + " is malformed");
    SafetensorsHeader::Entry e;
    e.dtype = dtypeNamed((*dtype));
    for (const json::Value &d : *shape) {
      int64_t n = d.getAsInteger().value_or(-1);
      if (n < 0)
        throw error(file + ": entry " + key + " has a negative or non-integer size");
      e.shape.push_back(n);
    }
    uint64_t begin = (*offsets)[0].getAsUINT64().value_or(~0ull);
    uint64_t end = (*offsets)[1].getAsUINT64().value_or(~0ull);
    if (begin > end || end > dataSize ||
        end - begin != static_cast<uint64_t>(product(e.shape) * dtypeSize(e.dtype)))
      throw error(file + ": entry " + key +
                  " has data offsets that do not match its shape (truncated or corrupt file)");
    e.dataOffset = dataStart + begin;
    out.entries[key] = std::move(e);
  }
  return out;
}
/// A file's bytes in memory.
class MemoryFile final : public File {
public:
  explicit MemoryFile(const std::string &bytes) : bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t offset, uint64_t n, void *out) const override {
    if (offset > bytes_.size() || n > bytes_.size() - offset)
      throw error("a read past the end of a file in memory");
    std::memcpy(out, bytes_.data() + offset, n);
  }

private:
  const std::string &bytes_;
};
} // namespace

SafetensorsHeader tdx::rt::checkSafetensors(const std::string &bytes, const std::string &file) {
  return parseHeader(MemoryFile(bytes), file);
}

SafetensorsHeader TensorStore::addOpened(const std::string &file,
                                         std::shared_ptr<const OpenFile> opened) {
  SafetensorsHeader header = parseHeader(*opened, file);
  files_[file] = std::move(opened);
  return header;
}

void TensorStore::addFile(const std::string &file) {
  SafetensorsHeader header = addOpened(file, std::make_shared<const LocalFile>(file));
  for (auto &[name, e] : header.entries) {
    StoredTensor t;
    t.dtype = e.dtype;
    t.shape = e.shape;
    StoredChunk c;
    c.file = file;
    c.dataOffset = e.dataOffset;
    c.offset.assign(e.shape.size(), 0);
    c.shape = e.shape;
    t.chunks.push_back(std::move(c));
    if (!entries_.emplace(name, std::move(t)).second)
      throw error(path_ + ": '" + name + "' is stored in two files");
  }
}

const StoredTensor *TensorStore::find(const std::string &name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

const StoredTensor &TensorStore::expect(const std::string &name, const std::string &what,
                                        const std::vector<int64_t> &shape) const {
  const StoredTensor *t = find(name);
  if (!t)
    throw error(path_ + " has no " + what + " '" + name + "'");
  if (t->shape != shape)
    throw error(what + " '" + name + "' in " + path_ + " has another shape than the program's");
  return *t;
}

void TensorStore::read(const std::string &name, void *out) const {
  const StoredTensor *t = find(name);
  if (!t)
    throw error(path_ + " has no tensor '" + name + "'");
  readBox(name, std::vector<int64_t>(t->shape.size(), 0), t->shape, out);
}

void TensorStore::readBox(const std::string &name, const std::vector<int64_t> &offset,
                          const std::vector<int64_t> &size, void *out) const {
  const StoredTensor *t = find(name);
  if (!t)
    throw error(path_ + " has no tensor '" + name + "'");
  size_t rank = t->shape.size();
  if (offset.size() != rank || size.size() != rank)
    throw error("readBox: box rank does not match the tensor's");
  for (size_t d = 0; d < rank; ++d)
    if (offset[d] < 0 || size[d] < 0 || offset[d] + size[d] > t->shape[d])
      throw error("readBox: the box is outside tensor '" + name + "'");
  int64_t item = dtypeSize(t->dtype);
  char *dst = static_cast<char *>(out);
  for (const StoredChunk &c : t->chunks) {
    // The part of the box this chunk holds.
    std::vector<int64_t> inChunk(rank), inBox(rank), extent(rank);
    bool empty = false, whole = true;
    for (size_t d = 0; d < rank; ++d) {
      int64_t lo = std::max(offset[d], c.offset[d]);
      int64_t hi = std::min(offset[d] + size[d], c.offset[d] + c.shape[d]);
      empty |= hi <= lo;
      inChunk[d] = lo - c.offset[d], inBox[d] = lo - offset[d], extent[d] = hi - lo;
      whole &= extent[d] == c.shape[d];
    }
    if (empty)
      continue;
    const OpenFile &file = *files_.at(c.file);
    using Run = OpenFile::Run;
    // Runs come in the chunk's order, split into pieces of at most
    // kReadPiece bytes, and are read a batch at a time (a large chunk read
    // whole, or a box across another layout's chunk in many small runs); a
    // chunk read whole is checksummed piece by piece and the pieces'
    // checksums combined in order.
    bool checked = whole && c.hasCrc;
    uint32_t crc = 0;
    std::vector<Run> runs;
    uint64_t batchBytes = 0;
    auto flush = [&]() {
      file.readRuns(runs, checked);
      if (checked)
        for (const Run &r : runs)
          crc = crc32cCombine(crc, r.crc, r.bytes);
      runs.clear();
      batchBytes = 0;
    };
    forEachCopyRun(c.shape, inChunk, size, inBox, extent, [&](int64_t a, int64_t b, int64_t run) {
      uint64_t at = c.dataOffset + static_cast<uint64_t>(a * item);
      uint64_t bytes = static_cast<uint64_t>(run * item);
      char *to = dst + b * item;
      bytesRead_ += bytes;
      for (uint64_t done = 0; done < bytes; done += kReadPiece) {
        uint64_t n = std::min(kReadPiece, bytes - done);
        runs.push_back({at + done, n, to + done, 0});
        batchBytes += n;
        if (runs.size() == kRunBatch || batchBytes >= kBatchBytes)
          flush();
      }
    });
    flush();
    if (whole && c.hasCrc && crc != c.crc) {
      std::string box;
      for (size_t d = 0; d < rank; ++d)
        box += (d ? ", " : "") + std::to_string(c.offset[d]);
      throw error("checksum mismatch in " + c.file + ": tensor '" + name + "', the chunk at [" +
                  box + "] (file bytes " + std::to_string(c.dataOffset) + " to " +
                  std::to_string(c.dataOffset + static_cast<uint64_t>(c.numel() * item)) +
                  "); the checkpoint is corrupt");
    }
  }
}

namespace {

/// Hands the bytes of a safetensors file to `write` (the header, padded so
/// the data starts 64-byte aligned, then the tensors' data in order) and
/// returns their size and checksums.
WrittenFile emitSafetensors(const std::vector<TensorToWrite> &tensors,
                            const std::map<std::string, std::string> &metadata,
                            const std::function<void(const void *, uint64_t)> &write) {
  json::Object header;
  if (!metadata.empty()) {
    json::Object meta;
    for (const auto &[k, v] : metadata)
      meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  std::vector<uint64_t> bytes;
  for (const TensorToWrite &t : tensors) {
    json::Array shape;
    for (int64_t d : t.shape)
      shape.push_back(d);
    uint64_t size = static_cast<uint64_t>(product(t.shape) * dtypeSize(t.dtype));
    header[t.name] = json::Object{{"dtype", dtypeName(t.dtype)},
                                        {"shape", std::move(shape)},
                                        {"data_offsets", json::Array{offset, offset + size}}};
    offset += size;
    bytes.push_back(size);
  }
  std::string text = json::print(json::Value(std::move(header)));
  // Spaces (the format allows them) align the data to 64 bytes.
  while ((8 + text.size()) % 64)
    text += ' ';
  WrittenFile out;
  uint64_t size = text.size();
  write(&size, 8);
  write(text.data(), text.size());
  out.crc = crc32c(text.data(), text.size(), crc32c(&size, 8));
  for (size_t i = 0; i < tensors.size(); ++i) {
    write(tensors[i].data, bytes[i]);
    // One pass over the data: the file's checksum is combined from the
    // tensors'.
    out.tensorCrcs.push_back(crc32c(tensors[i].data, bytes[i]));
    out.crc = crc32cCombine(out.crc, out.tensorCrcs.back(), bytes[i]);
  }
  out.size = 8 + text.size() + offset;
  return out;
}

} // namespace

WrittenFile tdx::rt::writeSafetensorsFile(const std::string &path,
                                          const std::vector<TensorToWrite> &tensors,
                                          const std::map<std::string, std::string> &metadata,
                                          bool sync) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw error("cannot create " + path);
  WrittenFile out;
  try {
    out = emitSafetensors(tensors, metadata,
                          [&](const void *data, uint64_t n) { writeAll(fd, path, data, n); });
    if (sync && ::fsync(fd) != 0)
      throw error("cannot write " + path + ": fsync failed");
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0)
    throw error("cannot write " + path);
  return out;
}

std::string tdx::rt::serializeSafetensors(const std::vector<TensorToWrite> &tensors,
                                          const std::map<std::string, std::string> &metadata,
                                          WrittenFile &written) {
  std::string bytes;
  written = emitSafetensors(tensors, metadata, [&](const void *data, uint64_t n) {
    bytes.append(static_cast<const char *>(data), n);
  });
  return bytes;
}

void tdx::rt::writeSafetensors(const std::string &path, const std::vector<TensorToWrite> &tensors) {
  std::string tmp = path + ".tmp";
  try {
    writeSafetensorsFile(tmp, tensors, {}, false);
  } catch (...) {
    std::remove(tmp.c_str());
    throw error("cannot write " + path);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw error("cannot write " + path);
}
