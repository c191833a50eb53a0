//===- Volumes.cpp - the tensor store over the network --------------------===//
//
// The client side of the volumes' protocol (tools/tdx-volume serves it).
// A request is a header, JSON text {"op": ..., "id": N, ...}, and a payload
// (a file's bytes; the byte ranges of a read, as pairs of little-endian
// uint64); a reply is {"id": N, "ok": true, ...} and a payload, or
// {"ok": false, "error": "...", "code": "stale" | "no-key" | ...}.
//
//===----------------------------------------------------------------------===//

#include "tdx/Store/Volumes.h"
#include "tdx/StateFormat/Crc32c.h"
#include "tdx/StateFormat/Json.h"
#include "tdx/Store/Ucx.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <unistd.h>

#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>

using namespace tdx::rt;

namespace {

std::runtime_error error(const std::string &what) { return std::runtime_error("tdx: " + what); }

constexpr const char *kScheme = "ucx://";

struct Address {
  std::string host;
  uint16_t port = 0;
  std::string text() const { return host + ":" + std::to_string(port); }
};

/// "ucx://h1:7070,h2:7070[/KEY[/step-N]]".
struct StorePath {
  std::string store;
  std::vector<Address> volumes;
  std::string key;
  std::optional<int64_t> step;
  const Address &home() const { return volumes.front(); }
};

Address parseAddress(const std::string &text, const std::string &path) {
  size_t colon = text.rfind(':');
  Address a;
  a.host = text.substr(0, colon);
  char *end = nullptr;
  long port = colon == std::string::npos ? 0 : std::strtol(text.c_str() + colon + 1, &end, 10);
  if (colon == std::string::npos || a.host.empty() || !end || *end || port <= 0 || port > 65535)
    throw error("'" + text + "' in " + path +
                " is not a volume's HOST:PORT (a store is ucx://HOST:PORT[,HOST:PORT...])");
  a.port = static_cast<uint16_t>(port);
  return a;
}

StorePath parsePath(const std::string &path) {
  if (!isVolumePath(path))
    throw error(path + " is not a networked store (ucx://HOST:PORT[,HOST:PORT...])");
  std::string rest = path.substr(std::strlen(kScheme));
  size_t slash = rest.find('/');
  StorePath p;
  p.store = kScheme + rest.substr(0, slash);
  std::string list = rest.substr(0, slash);
  for (size_t at = 0; at <= list.size();) {
    size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at)
      p.volumes.push_back(parseAddress(list.substr(at, comma - at), path));
    at = comma + 1;
  }
  if (p.volumes.empty())
    throw error(path + " names no volume (a store is ucx://HOST:PORT[,HOST:PORT...])");
  if (slash == std::string::npos)
    return p;
  std::string tail = rest.substr(slash + 1);
  size_t next = tail.find('/');
  p.key = tail.substr(0, next);
  storeKeyPath(p.store, p.key); // checks the key's name
  if (next != std::string::npos) {
    std::string step = tail.substr(next + 1);
    char *end = nullptr;
    long long n = step.rfind("step-", 0) == 0 ? std::strtoll(step.c_str() + 5, &end, 10) : -1;
    if (n < 0 || !end || *end)
      throw error(path + ": '" + step + "' is not a version (step-00000003)");
    p.step = n;
  }
  return p;
}

StorePath parseKeyPath(const std::string &path) {
  StorePath p = parsePath(path);
  if (p.key.empty())
    throw error(path + " names a store, not a key (ucx://HOST:PORT,.../KEY)");
  return p;
}

double timeoutSeconds() {
  const char *s = std::getenv("TDX_STORE_TIMEOUT");
  double t = s ? std::atof(s) : 0;
  return t > 0 ? t : 10;
}

struct Reply {
  json::Object header;
  std::string data;
};

/// This process's connections to volumes: one UCX worker, one request at
/// a time (the volumes serve many clients at once).
class Client {
public:
  /// This process's client; with `fresh`, a new one (a new UCX worker).
  static Client &get(bool fresh = false) {
    static std::mutex made;
    static Client *client = nullptr;
    std::lock_guard<std::mutex> lock(made);
    // A forked child makes its own (the parent's worker is not its to use).
    // An old one is left alone: a thread may still be in it.
    if (!client || fresh || client->pid_ != ::getpid())
      client = new Client();
    return *client;
  }

  /// Thrown when a connection failed (not a timeout): a worker made before
  /// this host's network came up does not know its interfaces.
  struct Unreachable : std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  /// Sends `header` (the request's id and the job's token added) and
  /// `data` to `a`; the reply, an error reply too. With `raw`, the header
  /// is that text as it is (a JSON object gets the id; a reply to a header
  /// the volume could not read is taken as this one's).
  Reply exchange(const Address &a, json::Object header, std::string data,
                 const std::string &what, const std::string *raw = nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t id = nextId_++;
    std::string token = storeToken();
    std::string text;
    if (raw) {
      std::optional<json::Value> parsed = json::parse(*raw);
      text = *raw;
      if (const json::Object *o = parsed ? parsed->getAsObject() : nullptr) {
        json::Object withId = *o;
        withId["id"] = id;
        text = json::print(withId);
      }
    } else {
      header["id"] = id;
      if (!token.empty())
        header["token"] = token;
      text = json::print(header);
    }
    void *ep = endpoint(a);
    worker_.send(ep, ucx::kRequest, std::move(text), std::move(data));
    double seconds = timeoutSeconds();
    auto deadline =
        ucx::Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
    std::optional<Reply> reply;
    std::string failed;
    worker_.waitUntil(
        [&] {
          auto &inbox = worker_.inbox(ucx::kReply);
          while (!inbox.empty()) {
            ucx::Message m = std::move(inbox.front());
            inbox.pop_front();
            std::optional<json::Value> h = json::parse(m.header);
            const json::Object *o = h ? h->getAsObject() : nullptr;
            std::optional<int64_t> got = o ? o->getInteger("id") : std::nullopt;
            // A late reply to a request that timed out is dropped.
            if (o && (got == id || (raw && got == -1))) {
              reply = Reply{*o, std::move(m.data)};
              return true;
            }
          }
          failed = worker_.failure(ep);
          return !failed.empty();
        },
        deadline);
    if (!reply) {
      worker_.close(ep);
      endpoints_.erase(a.text());
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", seconds);
      std::string message =
          "tdx: the store volume " + a.text() + " on host '" + a.host + "' " +
          (failed.empty() ? "did not answer in " + std::string(secs) + " s (TDX_STORE_TIMEOUT)"
                          : "is unreachable (" + failed + ")") +
          " while " + what + ": is the host up and its volume running (tdx-volume)?";
      if (failed.empty())
        throw std::runtime_error(message);
      throw Unreachable(message);
    }
    return std::move(*reply);
  }

  /// exchange(), an error reply thrown.
  Reply request(const Address &a, json::Object header, std::string data,
                const std::string &what) {
    Reply reply = exchange(a, std::move(header), std::move(data), what);
    if (std::optional<std::string> failure = reply.header.getString("error")) {
      std::string message = "the store volume " + a.text() + ": " + *failure;
      std::optional<std::string> code = reply.header.getString("code");
      if (code == std::optional<std::string>("stale"))
        throw StaleVersion("tdx: " + message);
      if (code == std::optional<std::string>("unauthorized"))
        message += storeToken().empty()
                       ? " (this process has no job token: set TDX_STORE_TOKEN to the token "
                         "the volume was started with, or to a file holding it)"
                       : " (this process's TDX_STORE_TOKEN is not the volume's: another "
                         "job's store?)";
      throw error(message);
    }
    return reply;
  }

private:
  Client() : pid_(::getpid()) {}
  void *endpoint(const Address &a) {
    auto it = endpoints_.find(a.text());
    // A connection that failed is made anew (the volume may be back).
    if (it != endpoints_.end() && !worker_.failure(it->second).empty()) {
      worker_.close(it->second);
      endpoints_.erase(it);
      it = endpoints_.end();
    }
    if (it == endpoints_.end())
      it = endpoints_.emplace(a.text(), worker_.connect(a.host, a.port)).first;
    return it->second;
  }

  pid_t pid_;
  std::mutex mutex_;
  ucx::Worker worker_;
  std::map<std::string, void *> endpoints_;
  int64_t nextId_ = 1;
};

Reply request(const Address &a, json::Object header, std::string data, const std::string &what) {
  try {
    return Client::get().request(a, header, data, what);
  } catch (const Client::Unreachable &) {
    // Once more on a new worker, which sees the interfaces up now.
    return Client::get(true).request(a, std::move(header), std::move(data), what);
  }
}

/// The IPv4 addresses `host` resolves to.
std::set<uint32_t> addressesOf(const std::string &host) {
  std::set<uint32_t> out;
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) == 0) {
    for (addrinfo *a = found; a; a = a->ai_next)
      out.insert(reinterpret_cast<sockaddr_in *>(a->ai_addr)->sin_addr.s_addr);
    ::freeaddrinfo(found);
  }
  return out;
}

/// The volume on this host: the one whose name resolves to an address of
/// one of this host's interfaces.
const Address &localVolume(const StorePath &p) {
  std::set<uint32_t> mine;
  ifaddrs *list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs *i = list; i; i = i->ifa_next)
      if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET)
        mine.insert(reinterpret_cast<sockaddr_in *>(i->ifa_addr)->sin_addr.s_addr);
    ::freeifaddrs(list);
  }
  for (const Address &a : p.volumes)
    for (uint32_t address : addressesOf(a.host))
      if (mine.count(address))
        return a;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  throw error("no volume of the store " + p.store + " runs on this host ('" + host +
              "'): a writer puts its shards on its own host's volume; start one here "
              "(tdx-volume --port PORT) and list it in the store");
}

std::string versionPath(const StorePath &p, int64_t step) {
  return p.store + "/" + p.key + "/" + stepDirName(step);
}

/// A file of a version on a volume; reads fetch its byte ranges.
class RemoteFile final : public TensorStore::OpenFile {
public:
  RemoteFile(Address volume, std::string key, int64_t version, std::string file, uint64_t size)
      : volume_(std::move(volume)), key_(std::move(key)), version_(version),
        file_(std::move(file)), size_(size) {}
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, uint64_t n, void *out) const override {
    std::vector<Run> runs{{offset, n, static_cast<char *>(out), 0}};
    readRuns(runs, false);
  }
  void readRuns(std::vector<Run> &runs, bool checksum) const override {
    std::string ranges(runs.size() * 16, '\0');
    uint64_t total = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (runs[i].offset + runs[i].bytes > size_)
        throw error(file_ + " of version " + std::to_string(version_) + " of key '" + key_ +
                    "' is truncated (a read past its end)");
      std::memcpy(&ranges[i * 16], &runs[i].offset, 8);
      std::memcpy(&ranges[i * 16 + 8], &runs[i].bytes, 8);
      total += runs[i].bytes;
    }
    Reply r = request(volume_,
                      json::Object{{"op", "read"},
                                   {"key", key_},
                                   {"version", version_},
                                   {"file", file_}},
                      std::move(ranges),
                      "reading " + file_ + " of version " + std::to_string(version_) +
                          " of key '" + key_ + "'");
    if (r.data.size() != total)
      throw error("the store volume " + volume_.text() + " sent " + std::to_string(r.data.size()) +
                  " bytes of " + file_ + " for " + std::to_string(total) + " asked");
    const char *at = r.data.data();
    for (Run &run : runs) {
      std::memcpy(run.dst, at, run.bytes);
      if (checksum)
        run.crc = crc32c(run.dst, run.bytes);
      at += run.bytes;
    }
  }

private:
  Address volume_;
  std::string key_;
  int64_t version_;
  std::string file_;
  uint64_t size_;
};

/// Every volume of the store drops the versions of `key` below `below`.
/// A volume that cannot be reached keeps them (its report says so); the
/// versions committed are not affected.
void dropBelow(const StorePath &p, int64_t below) {
  for (const Address &a : p.volumes) {
    try {
      request(a, json::Object{{"op", "drop"}, {"key", p.key}, {"below", below}}, "",
              "dropping old versions of key '" + p.key + "'");
    } catch (const std::exception &e) {
      std::fprintf(stderr, "%s (its old versions stay until it is reached)\n", e.what());
    }
  }
}

std::vector<std::string> strings(const json::Array *a) {
  std::vector<std::string> out;
  if (a)
    for (const json::Value &v : *a)
      out.push_back(v.getAsString().value_or(""));
  return out;
}

} // namespace

std::string tdx::rt::storeToken() {
  const char *value = std::getenv("TDX_STORE_TOKEN");
  if (!value || !*value)
    return "";
  if (value[0] != '/')
    return value;
  // A file holding it (kept out of the environment a process listing shows).
  static std::mutex mutex;
  static std::map<std::string, std::string> read;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = read.find(value);
  if (it != read.end())
    return it->second;
  std::FILE *f = std::fopen(value, "r");
  if (!f)
    throw error(std::string("TDX_STORE_TOKEN names the file ") + value +
                ", which cannot be read (the store's job token is TDX_STORE_TOKEN's value, "
                "or the first line of the file it names by an absolute path)");
  char line[4096] = {};
  bool got = std::fgets(line, sizeof line, f) != nullptr;
  std::fclose(f);
  std::string token = got ? line : "";
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back())))
    token.pop_back();
  if (token.empty())
    throw error(std::string("TDX_STORE_TOKEN names the file ") + value +
                ", whose first line is empty: write the job's token there");
  return read[value] = token;
}

bool tdx::rt::tokenMatches(const std::string &token, const std::string &given) {
  // Every byte compared whatever differs first: the time taken tells no
  // prefix of the token.
  unsigned char differ = token.size() != given.size();
  for (size_t i = 0; i < token.size(); ++i)
    differ |= static_cast<unsigned char>(token[i] ^ (i < given.size() ? given[i] : ~token[i]));
  return differ == 0;
}

std::pair<std::string, std::string> tdx::rt::volumeRequest(const std::string &volume,
                                                           const std::string &header,
                                                           const std::string &data) {
  Address a = parseAddress(volume, volume);
  Reply r = Client::get().exchange(a, {}, data, "sending a request", &header);
  return {json::print(r.header), std::move(r.data)};
}

bool tdx::rt::isVolumePath(const std::string &path) { return path.rfind(kScheme, 0) == 0; }

void tdx::rt::openVolumeVersion(const std::string &path,
                                const std::function<void(const VolumeVersion &)> &add) {
  StorePath p = parseKeyPath(path);
  for (int attempt = 0;; ++attempt) {
    json::Object ask{{"op", "index"}, {"key", p.key}};
    if (p.step)
      ask["version"] = *p.step;
    Reply r = request(p.home(), ask, "", "opening key '" + p.key + "'");
    int64_t version = r.header.getInteger("version").value_or(-1);
    std::optional<json::Value> index = json::parse(r.data);
    const json::Object *files =
        index && index->getAsObject() ? index->getAsObject()->getObject("files") : nullptr;
    if (!files)
      throw error("the index of version " + std::to_string(version) + " of key '" + p.key +
                  "' on " + p.home().text() + " is corrupt");
    VolumeVersion v;
    v.path = versionPath(p, version);
    v.index = r.data;
    v.open = [=](const std::string &name, uint64_t size) {
      const json::Value *entry = files->get(name);
      std::optional<std::string> volume =
          entry && entry->getAsObject() ? entry->getAsObject()->getString("volume") : std::nullopt;
      if (!volume)
        throw error(v.path + ": the index names no volume for file " + name);
      return std::shared_ptr<const TensorStore::OpenFile>(std::make_shared<RemoteFile>(
          parseAddress(*volume, v.path), p.key, version, name, size));
    };
    try {
      add(v);
      return;
    } catch (const StaleVersion &) {
      if (p.step || attempt >= 8)
        throw;
    }
  }
}

PendingCheckpoint tdx::rt::beginVolumeVersion(const std::string &root, int64_t step) {
  StorePath p = parseKeyPath(root);
  json::Object ask{{"op", "begin"}, {"key", p.key}};
  if (step >= 0)
    ask["at"] = step;
  Reply r = request(p.home(), std::move(ask), "", "starting a version of key '" + p.key + "'");
  PendingCheckpoint pending;
  pending.root = root;
  pending.step = r.header.getInteger("version").value_or(0);
  pending.id = newCheckpointId(pending.step);
  return pending;
}

std::string tdx::rt::putVolumeFile(const PendingCheckpoint &pending, const std::string &file,
                                   const std::vector<BoxToWrite> &boxes) {
  StorePath p = parseKeyPath(pending.root);
  const Address &volume = localVolume(p);
  WrittenFile written;
  std::string bytes = serializeSafetensors(
      checkpointTensors(boxes), {{"tdx.checkpoint", pending.id}, {"tdx.file", file}}, written);
  request(volume,
          json::Object{{"op", "put"}, {"key", p.key}, {"version", pending.step}, {"file", file}},
          std::move(bytes),
          "putting " + file + " of version " + std::to_string(pending.step) + " of key '" +
              p.key + "'");
  return checkpointPart(file, written, boxes, volume.text());
}

std::string tdx::rt::commitVolumeVersion(const PendingCheckpoint &pending,
                                         const std::string &index, int keep) {
  StorePath p = parseKeyPath(pending.root);
  Reply r = request(
      p.home(),
      json::Object{{"op", "commit"}, {"key", p.key}, {"version", pending.step}, {"keep", keep}},
      index, "committing version " + std::to_string(pending.step) + " of key '" + p.key + "'");
  // Committed: only now do older versions go.
  if (std::optional<int64_t> oldest = r.header.getInteger("oldest"))
    dropBelow(p, *oldest);
  return versionPath(p, pending.step);
}

std::vector<std::string> tdx::rt::volumeKeys(const std::string &store) {
  StorePath p = parsePath(store);
  Reply r = request(p.home(), json::Object{{"op", "keys"}}, "", "listing keys");
  return strings(r.header.getArray("keys"));
}

std::vector<int64_t> tdx::rt::volumeVersions(const std::string &store, const std::string &key) {
  StorePath p = parsePath(store);
  Reply r = request(p.home(), json::Object{{"op", "versions"}, {"key", key}}, "",
                    "listing the versions of key '" + key + "'");
  std::vector<int64_t> out;
  if (const json::Array *a = r.header.getArray("versions"))
    for (const json::Value &v : *a)
      out.push_back(v.getAsInteger().value_or(0));
  return out;
}

void tdx::rt::deleteVolumeKey(const std::string &store, const std::string &key) {
  StorePath p = parseKeyPath(store + "/" + key);
  request(p.home(), json::Object{{"op", "delete"}, {"key", key}}, "",
          "deleting key '" + key + "'");
  dropBelow(p, LLONG_MAX);
}

std::map<std::string, std::string> tdx::rt::volumeStatus(const std::string &store) {
  StorePath p = parsePath(store);
  std::map<std::string, std::string> out;
  for (const Address &a : p.volumes) {
    json::Object report = request(a, json::Object{{"op", "stat"}}, "", "asking its status").header;
    report.erase("id");
    out[a.text()] = json::print(report);
  }
  return out;
}

std::unique_ptr<TensorStore> tdx::rt::openState(const std::string &path) {
  if (!isVolumePath(path))
    return std::make_unique<TensorStore>(path);
  std::unique_ptr<TensorStore> store;
  openVolumeVersion(path, [&](const VolumeVersion &v) {
    store = std::make_unique<TensorStore>(v.path, v.index, v.open);
  });
  return store;
}

PendingCheckpoint tdx::rt::beginVersion(const std::string &root, int64_t step) {
  return isVolumePath(root) ? beginVolumeVersion(root, step) : beginCheckpoint(root, step);
}

std::string tdx::rt::writeVersionFile(const PendingCheckpoint &pending, const std::string &file,
                                      const std::vector<BoxToWrite> &boxes) {
  return isVolumePath(pending.root) ? putVolumeFile(pending, file, boxes)
                                    : writeCheckpointFile(pending, file, boxes);
}

std::string tdx::rt::commitVersion(const PendingCheckpoint &pending,
                                   const std::vector<std::string> &parts,
                                   const std::map<std::string, std::string> &metadata, int keep) {
  if (!isVolumePath(pending.root))
    return commitCheckpoint(pending, parts, metadata, keep);
  return commitVolumeVersion(pending, checkpointIndex(pending, parts, metadata), keep);
}
