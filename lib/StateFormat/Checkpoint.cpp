//===- Checkpoint.cpp - sharded, crash-safe checkpoints -------------------===//

#include "tdx/StateFormat/Checkpoint.h"
#include "tdx/StateFormat/Crc32c.h"
#include "tdx/StateFormat/Safetensors.h"

#include "tdx/StateFormat/Json.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

using namespace tdx::rt;

namespace {

constexpr const char *kIndex = "tdx.index.json";
constexpr const char *kFormat = "tdx.checkpoint";

std::runtime_error error(const std::string &what) { return std::runtime_error("tdx: " + what); }

bool exists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

/// fsync of a file or directory: what was written or renamed there is on disk.
void syncPath(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    if (fd >= 0)
      ::close(fd);
    throw error("cannot sync " + path);
  }
  ::close(fd);
}

/// Writes `text` to `path` durably: a temporary file, fsync, rename, fsync of
/// the directory. A reader sees the old file or the new one.
void writeDurably(const std::string &dir, const std::string &name, const std::string &text) {
  std::string tmp = dir + "/." + name + ".tmp", path = dir + "/" + name;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw error("cannot create " + tmp);
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            ::fsync(fd) == 0;
  ok &= ::close(fd) == 0;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0)
    throw error("cannot write " + path);
  syncPath(dir);
}

std::string readText(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The names in a directory (none when it cannot be read).
std::vector<std::string> names(const std::string &dir) {
  std::vector<std::string> out;
  if (DIR *d = ::opendir(dir.c_str())) {
    while (dirent *e = ::readdir(d))
      out.push_back(e->d_name);
    ::closedir(d);
  }
  return out;
}

/// Step directories of a root, by step.
std::map<int64_t, std::string> stepDirs(const std::string &root) {
  std::map<int64_t, std::string> out;
  for (const std::string &name : names(root))
    if (name.rfind("step-", 0) == 0 && name.size() > 5 &&
        name.find_first_not_of("0123456789", 5) == std::string::npos)
      out[std::stoll(name.substr(5))] = name;
  return out;
}

void removeTree(const std::string &path) {
  auto remove = [](const char *file, const struct stat *, int, struct FTW *) {
    return ::remove(file);
  };
  if (::nftw(path.c_str(), remove, 16, FTW_DEPTH | FTW_PHYS) != 0)
    throw error("cannot remove " + path + ": " + std::strerror(errno));
}

/// mkdir -p.
void makeDirectories(const std::string &path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i < path.size() && path[i] != '/')
      continue;
    std::string prefix = path.substr(0, i);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST)
      throw error("cannot create the checkpoint directory " + path + ": " + std::strerror(errno));
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw error("cannot create the checkpoint directory " + path + ": a file is in the way");
}

json::Array toJson(const std::vector<int64_t> &v) {
  json::Array a;
  for (int64_t x : v)
    a.push_back(x);
  return a;
}

std::vector<int64_t> ints(const json::Array *a, const std::string &what) {
  if (!a)
    throw error(what + " is missing");
  std::vector<int64_t> out;
  for (const json::Value &v : *a) {
    std::optional<int64_t> n = v.getAsInteger();
    if (!n || *n < 0)
      throw error(what + " holds a negative or non-integer value");
    out.push_back(*n);
  }
  return out;
}

std::string boxText(const std::vector<int64_t> &offset, const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t d = 0; d < offset.size(); ++d)
    s += (d ? ", " : "") + std::to_string(offset[d]) + ":" + std::to_string(offset[d] + shape[d]);
  return s + "]";
}

/// The index and its parts, one member per line.
std::string printIndented(json::Value v) { return json::print(v, 1); }

} // namespace

std::string tdx::rt::stepDirName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

bool tdx::rt::isCheckpoint(const std::string &path) {
  return exists(path + "/" + kIndex) || exists(path + "/LATEST") || !stepDirs(path).empty();
}

std::string tdx::rt::resolveCheckpoint(const std::string &path) {
  if (exists(path + "/" + kIndex))
    return path;
  if (exists(path + "/LATEST")) {
    std::string name = readText(path + "/LATEST");
    while (!name.empty() && (name.back() == '\n' || name.back() == ' '))
      name.pop_back();
    if (name.find('/') != std::string::npos || name.empty() ||
        !exists(path + "/" + name + "/" + kIndex))
      throw error(path + "/LATEST names '" + name + "', which is not a committed checkpoint");
    return path + "/" + name;
  }
  // A crash between committing a step and moving LATEST leaves the step
  // complete: the newest step with an index is the latest.
  std::map<int64_t, std::string> steps = stepDirs(path);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it)
    if (exists(path + "/" + it->second + "/" + kIndex))
      return path + "/" + it->second;
  throw error("no committed checkpoint in " + path + " (no " + kIndex + ", no LATEST)");
}

int64_t tdx::rt::nextStep(const std::string &root) {
  std::map<int64_t, std::string> steps = stepDirs(root);
  return steps.empty() ? 0 : steps.rbegin()->first + 1;
}

std::string tdx::rt::storeKeyPath(const std::string &store, const std::string &key) {
  bool ok = !key.empty() && key[0] != '.' && key.size() <= 200;
  for (char c : key)
    ok &= std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  if (!ok)
    throw error("store key '" + key +
                "' is not valid: use letters, digits, '.', '_' and '-' "
                "(not first), at most 200 characters");
  if (store.empty())
    throw error("no tensor store given for key '" + key + "': pass --store PATH or set TDX_STORE");
  return store + "/" + key;
}

std::string tdx::rt::newCheckpointId(int64_t step) {
  std::random_device device;
  std::mt19937_64 gen(device() ^ static_cast<uint64_t>(
                                     std::chrono::system_clock::now().time_since_epoch().count()));
  char id[64];
  std::snprintf(id, sizeof id, "%s-%016llx", stepDirName(step).c_str(),
                static_cast<unsigned long long>(gen()));
  return id;
}

PendingCheckpoint tdx::rt::beginCheckpoint(const std::string &root, int64_t step) {
  makeDirectories(root);
  if (step < 0)
    step = nextStep(root);
  PendingCheckpoint p;
  p.root = root;
  p.step = step;
  p.tmp = root + "/." + stepDirName(step) + ".tmp";
  if (exists(p.tmp))
    removeTree(p.tmp);
  if (::mkdir(p.tmp.c_str(), 0755) != 0)
    throw error("cannot create " + p.tmp + ": " + std::strerror(errno));
  p.id = newCheckpointId(step);
  return p;
}

std::string tdx::rt::checkpointPart(const std::string &file, const WrittenFile &written,
                                    const std::vector<BoxToWrite> &boxes,
                                    const std::string &volume) {
  json::Array chunks;
  for (size_t i = 0; i < boxes.size(); ++i)
    chunks.push_back(json::Object{{"tensor", boxes[i].name},
                                  {"dtype", dtypeName(boxes[i].dtype)},
                                  {"global_shape", toJson(boxes[i].globalShape)},
                                  {"offset", toJson(boxes[i].offset)},
                                  {"shape", toJson(boxes[i].shape)},
                                  {"crc32c", written.tensorCrcs[i]}});
  json::Object part{{"file", file},
                    {"size", written.size},
                    {"crc32c", written.crc},
                    {"chunks", std::move(chunks)}};
  if (!volume.empty())
    part["volume"] = volume;
  return printIndented(std::move(part));
}

std::vector<TensorToWrite> tdx::rt::checkpointTensors(const std::vector<BoxToWrite> &boxes) {
  std::vector<TensorToWrite> tensors;
  for (const BoxToWrite &b : boxes)
    tensors.push_back({b.name, b.dtype, b.shape, b.data});
  return tensors;
}

std::string tdx::rt::writeCheckpointFile(const PendingCheckpoint &p, const std::string &file,
                                         const std::vector<BoxToWrite> &boxes) {
  WrittenFile written = writeSafetensorsFile(p.tmp + "/" + file, checkpointTensors(boxes),
                                             {{"tdx.checkpoint", p.id}, {"tdx.file", file}}, true);
  return checkpointPart(file, written, boxes);
}

void tdx::rt::checkTiling(const std::string &where, const std::string &name,
                          const std::vector<int64_t> &shape,
                          const std::vector<StoredChunk> &chunks) {
  int64_t covered = 0, numel = 1;
  for (int64_t d : shape)
    numel *= d;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const StoredChunk &c = chunks[i];
    bool inside = c.offset.size() == shape.size() && c.shape.size() == shape.size();
    for (size_t d = 0; inside && d < shape.size(); ++d)
      inside = c.offset[d] + c.shape[d] <= shape[d];
    if (!inside)
      throw error(where + ": tensor '" + name + "': the chunk in " + c.file +
                  " lies outside the tensor (corrupt index)");
    for (size_t j = 0; j < i; ++j) {
      const StoredChunk &o = chunks[j];
      bool overlap = c.numel() > 0 && o.numel() > 0;
      for (size_t d = 0; overlap && d < shape.size(); ++d)
        overlap = c.offset[d] < o.offset[d] + o.shape[d] && o.offset[d] < c.offset[d] + c.shape[d];
      if (overlap)
        throw error(where + ": tensor '" + name + "': the chunks " + boxText(c.offset, c.shape) +
                    " in " + c.file + " and " + boxText(o.offset, o.shape) + " in " + o.file +
                    " overlap (corrupt index)");
    }
    covered += c.numel();
  }
  if (covered != numel)
    throw error(where + ": tensor '" + name + "': its chunks cover " + std::to_string(covered) +
                " of its " + std::to_string(numel) + " elements (a file's part is missing)");
}

std::string tdx::rt::checkpointIndex(const PendingCheckpoint &p,
                                     const std::vector<std::string> &parts,
                                     const std::map<std::string, std::string> &metadata) {
  json::Object files, tensors;
  std::map<std::string, std::vector<StoredChunk>> chunksOf;
  std::map<std::string, std::pair<std::string, std::vector<int64_t>>> typeOf;
  std::map<std::string, json::Array> chunkJson;
  for (const std::string &part : parts) {
    if (part.empty())
      continue;
    std::optional<json::Value> json = json::parse(part);
    if (!json)
      throw error("commitCheckpoint: a writer's part of the index is not JSON");
    const json::Object &o = *json->getAsObject();
    std::string file = o.getString("file").value_or("");
    json::Object entry{{"size", *o.getInteger("size")}, {"crc32c", *o.getInteger("crc32c")}};
    // A networked store's file says which volume holds it.
    if (std::optional<std::string> volume = o.getString("volume"))
      entry["volume"] = *volume;
    files[file] = std::move(entry);
    for (const json::Value &v : *o.getArray("chunks")) {
      const json::Object &c = *v.getAsObject();
      std::string name = c.getString("tensor").value_or("");
      StoredChunk chunk;
      chunk.file = file;
      chunk.offset = ints(c.getArray("offset"), "offset");
      chunk.shape = ints(c.getArray("shape"), "shape");
      auto type = std::make_pair(c.getString("dtype").value_or(""),
                                 ints(c.getArray("global_shape"), "shape"));
      auto [it, fresh] = typeOf.emplace(name, type);
      if (!fresh && it->second != type)
        throw error("commitCheckpoint: writers disagree on the dtype or shape of '" + name + "'");
      chunkJson[name].push_back(json::Object{{"file", file},
                                             {"offset", toJson(chunk.offset)},
                                             {"shape", toJson(chunk.shape)},
                                             {"crc32c", *c.getInteger("crc32c")}});
      chunksOf[name].push_back(std::move(chunk));
    }
  }
  for (auto &[name, type] : typeOf) {
    checkTiling(p.tmp.empty() ? p.root : p.tmp, name, type.second, chunksOf[name]);
    tensors[name] = json::Object{{"dtype", type.first},
                                 {"shape", toJson(type.second)},
                                 {"chunks", std::move(chunkJson[name])}};
  }
  json::Object meta;
  for (const auto &[k, v] : metadata)
    meta[k] = v;
  json::Object index{{"format", kFormat},
                     {"version", 1},
                     {"id", p.id},
                     {"step", p.step},
                     {"metadata", std::move(meta)},
                     {"files", std::move(files)},
                     {"tensors", std::move(tensors)}};
  return printIndented(std::move(index));
}

std::string tdx::rt::commitCheckpoint(const PendingCheckpoint &p,
                                      const std::vector<std::string> &parts,
                                      const std::map<std::string, std::string> &metadata,
                                      int keep) {
  std::string index = checkpointIndex(p, parts, metadata);
  // The files are synced by their writers; the index goes last.
  writeDurably(p.tmp, kIndex, index);
  std::string dir = p.root + "/" + stepDirName(p.step);
  if (exists(dir)) {
    // Another save of this step (LATEST may name it): swapped with the new
    // one in one step where the file system can, so LATEST never names a
    // missing directory; then removed.
    std::string old = p.root + "/." + stepDirName(p.step) + ".old";
    if (::renameat2(AT_FDCWD, p.tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
      syncPath(p.root);
      if (std::rename(p.tmp.c_str(), old.c_str()) != 0)
        throw error("cannot replace " + dir);
    } else if (std::rename(dir.c_str(), old.c_str()) != 0 ||
               std::rename(p.tmp.c_str(), dir.c_str()) != 0) {
      throw error("cannot replace " + dir);
    }
  } else if (std::rename(p.tmp.c_str(), dir.c_str()) != 0) {
    throw error("cannot commit " + dir);
  }
  syncPath(p.root);
  writeDurably(p.root, "LATEST", stepDirName(p.step) + "\n");
  // Committed: only now is anything older removed.
  // Leftovers of saves that never committed, and replaced steps.
  for (const std::string &name : names(p.root))
    if (name.rfind(".step-", 0) == 0)
      removeTree(p.root + "/" + name);
  if (keep > 0) {
    // A step goes out of sight at once (renamed hidden), then its files:
    // a crash never leaves a visible step with part of its files.
    std::map<int64_t, std::string> steps = stepDirs(p.root);
    int seen = 0;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      if (it->first == p.step || ++seen < keep)
        continue;
      std::string hidden = p.root + "/." + it->second + ".old";
      if (std::rename((p.root + "/" + it->second).c_str(), hidden.c_str()) != 0)
        throw error("cannot remove " + p.root + "/" + it->second);
      removeTree(hidden);
    }
  }
  return dir;
}

TensorStore::TensorStore(const std::string &path) : path_(path) {
  if (path.rfind("ucx://", 0) == 0)
    throw error(path + " names a networked store's key: open it with openState "
                "(tdx/Store/Volumes.h)");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw error("cannot open " + path + ": no such file or directory");
  if (!S_ISDIR(st.st_mode)) {
    addFile(path);
    return;
  }
  if (isCheckpoint(path)) {
    // A writer may commit a newer step and delete this one while it is
    // opened: then the newer one is read.
    for (int attempt = 0;; ++attempt) {
      path_ = resolveCheckpoint(path);
      try {
        addCheckpoint(path_);
        return;
      } catch (const std::runtime_error &) {
        if (attempt >= 8 || resolveCheckpoint(path) == path_)
          throw;
        entries_.clear(), metadata_.clear(), files_.clear();
      }
    }
  }
  std::vector<std::string> files;
  if (DIR *dir = ::opendir(path.c_str())) {
    while (dirent *e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0)
        files.push_back(path + "/" + name);
    }
    ::closedir(dir);
  }
  if (files.empty())
    throw error(path + " is a directory without *.safetensors files or a tdx checkpoint");
  std::sort(files.begin(), files.end());
  for (const std::string &f : files)
    addFile(f);
}

TensorStore::TensorStore(std::string path, const std::string &index, const FileOpener &open)
    : path_(std::move(path)) {
  addIndex(path_, path_ + "/", index, open);
}

void TensorStore::addCheckpoint(const std::string &dir) {
  addIndex(dir + "/" + kIndex, dir + "/", readText(dir + "/" + kIndex),
           [&](const std::string &name, uint64_t size) -> std::shared_ptr<const OpenFile> {
             std::string file = dir + "/" + name;
             if (!exists(file))
               throw error(dir + ": file " + name + " is missing (the index lists it)");
             struct stat st;
             ::stat(file.c_str(), &st);
             if (static_cast<uint64_t>(st.st_size) != size)
               throw error(file + " has " + std::to_string(st.st_size) +
                           " bytes but the index says " + std::to_string(size) +
                           " (truncated or replaced)");
             return openLocalFile(file);
           });
}

void TensorStore::addIndex(const std::string &indexPath, const std::string &prefix,
                           const std::string &text, const FileOpener &open) {
  std::optional<json::Value> json = json::parse(text);
  if (!json)
    throw error(indexPath + " is corrupt (not JSON)");
  const json::Object *index = json->getAsObject();
  if (!index || index->getString("format") != std::optional<std::string>(kFormat) ||
      index->getInteger("version") != std::optional<int64_t>(1))
    throw error(indexPath + " is not a tdx checkpoint index (format " + kFormat + ", version 1)");
  std::string id = index->getString("id").value_or("");
  const json::Object *files = index->getObject("files");
  const json::Object *tensors = index->getObject("tensors");
  if (!files || !tensors)
    throw error(indexPath + " is corrupt (no files or tensors)");
  if (const json::Object *meta = index->getObject("metadata"))
    for (const auto &[k, v] : *meta)
      metadata_[k] = v.getAsString().value_or("");
  metadata_["step"] = std::to_string(index->getInteger("step").value_or(0));
  std::map<std::string, SafetensorsHeader> headers;
  for (const auto &[name, value] : *files) {
    std::string file = prefix + name;
    if (name.find('/') != std::string::npos)
      throw error(indexPath + " names a file outside the checkpoint: " + name);
    std::optional<int64_t> size =
        value.getAsObject() ? value.getAsObject()->getInteger("size") : std::nullopt;
    if (!size || *size < 0)
      throw error(indexPath + ": file " + name + " has no size");
    SafetensorsHeader h = addOpened(file, open(name, static_cast<uint64_t>(*size)));
    if (h.metadata["tdx.checkpoint"] != id || h.metadata["tdx.file"] != name)
      throw error(file + " is not the file the index names (it says it is '" +
                  h.metadata["tdx.file"] + "' of checkpoint '" + h.metadata["tdx.checkpoint"] +
                  "'): swapped, renamed or copied from another checkpoint");
    headers[name] = std::move(h);
  }
  for (const auto &[name, value] : *tensors) {
    const json::Object *t = value.getAsObject();
    const json::Array *chunks = t ? t->getArray("chunks") : nullptr;
    if (!t || !chunks || !t->getString("dtype"))
      throw error(indexPath + ": tensor '" + name + "' is malformed");
    StoredTensor st;
    st.dtype = dtypeNamed(*t->getString("dtype"));
    st.shape = ints(t->getArray("shape"), indexPath + ": the shape of '" + name + "'");
    for (const json::Value &cv : *chunks) {
      const json::Object *c = cv.getAsObject();
      std::optional<std::string> file = c ? c->getString("file") : std::nullopt;
      if (!file || !headers.count((*file)))
        throw error(indexPath + ": a chunk of '" + name + "' names an unlisted file");
      StoredChunk chunk;
      chunk.file = prefix + (*file);
      chunk.offset = ints(c->getArray("offset"), indexPath + ": a chunk offset of '" + name + "'");
      chunk.shape = ints(c->getArray("shape"), indexPath + ": a chunk shape of '" + name + "'");
      if (std::optional<int64_t> crc = c->getInteger("crc32c"))
        chunk.hasCrc = true, chunk.crc = static_cast<uint32_t>(*crc);
      const SafetensorsHeader &h = headers[(*file)];
      auto e = h.entries.find(name);
      if (e == h.entries.end() || e->second.dtype != st.dtype || e->second.shape != chunk.shape)
        throw error(chunk.file + " does not hold the chunk of '" + name +
                    "' the index lists (another dtype or shape, or missing)");
      chunk.dataOffset = e->second.dataOffset;
      st.chunks.push_back(std::move(chunk));
    }
    checkTiling(prefix.substr(0, prefix.size() - 1), name, st.shape, st.chunks);
    entries_[name] = std::move(st);
  }
}

uint64_t tdx::rt::verifyCheckpoint(const std::string &path) {
  TensorStore store(path);
  std::string dir = store.path();
  std::optional<json::Value> json = json::parse(readText(dir + "/" + kIndex));
  if (!json)
    throw error(dir + "/" + kIndex + " is corrupt (not JSON)");
  // Each chunk first, to name the tensor and offset of a mismatch; then
  // every byte of each file (headers included).
  for (const auto &[name, t] : store.tensors()) {
    std::vector<char> data(static_cast<size_t>(t.numel() * dtypeSize(t.dtype)));
    store.read(name, data.data());
  }
  uint64_t checked = 0;
  std::vector<char> buffer(1 << 22);
  for (const auto &[name, value] : *json->getAsObject()->getObject("files")) {
    std::string file = dir + "/" + name;
    uint32_t want = static_cast<uint32_t>(value.getAsObject()->getInteger("crc32c").value_or(-1));
    int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw error("cannot open " + file);
    uint32_t crc = 0;
    ssize_t got;
    while ((got = ::read(fd, buffer.data(), buffer.size())) > 0) {
      crc = crc32c(buffer.data(), static_cast<size_t>(got), crc);
      checked += static_cast<uint64_t>(got);
    }
    ::close(fd);
    if (got < 0 || crc != want)
      throw error("checksum mismatch in " + file +
                  ": the file's bytes are not those written; "
                  "the checkpoint is corrupt");
  }
  return checked;
}
