//===- tdx-volume.cpp - a host's volume of the networked tensor store -----===//
//
// One per host of a networked tensor store (include/tdx/Store/Volumes.h):
// holds, in memory, the files the host's ranks put, and serves byte ranges
// of them to readers anywhere; the store's first volume also hands out a
// key's versions and holds their committed indexes. It serves UCX active
// messages (include/tdx/Store/Ucx.h) on one thread, asleep while idle.
//
//===----------------------------------------------------------------------===//

#include "tdx/StateFormat/Json.h"
#include "tdx/StateFormat/Safetensors.h"
#include "tdx/Store/Ucx.h"
#include "tdx/Store/Volumes.h"

#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

using namespace tdx::rt;

namespace {

const char *kUsage =
    "usage: tdx-volume [--port PORT] [--bind ADDR]\n"
    "\n"
    "A volume of tdx's networked tensor store: run one on every host of a store,\n"
    "then name them all in the store, the first one holding the keys' indexes:\n"
    "\n"
    "  h1$ TDX_STORE_TOKEN=/etc/job/token tdx-volume --port 7070\n"
    "  h2$ TDX_STORE_TOKEN=/etc/job/token tdx-volume --port 7070\n"
    "  tdx.store.Store(\"ucx://h1:7070,h2:7070\")   # in a job with that TDX_STORE_TOKEN\n"
    "\n"
    "--port PORT  the port to listen on (default 7070; 0 picks a free one). The\n"
    "             volume prints \"tdx-volume: serving on HOST:PORT\" once it accepts\n"
    "             connections.\n"
    "--bind ADDR  listen on this address only (an IPv4 address or a name of this\n"
    "             host, e.g. the cluster network's); default every address.\n"
    "\n"
    "The job token: with TDX_STORE_TOKEN set (the token, or the absolute path of a\n"
    "file whose first line is the token), every request must carry the same token\n"
    "(the job's ranks send theirs from their own TDX_STORE_TOKEN); any other is\n"
    "refused before anything is read or written, with the reason on stderr.\n"
    "Without it, anyone who reaches the port can read, write and delete (a warning\n"
    "says so at start).\n"
    "\n"
    "Malformed requests (a header that does not parse, a put whose bytes are not a\n"
    "whole safetensors file, a version or byte range out of range) are refused\n"
    "with a reason; the volume keeps serving and what it holds is unchanged.\n"
    "\n"
    "It holds what this host's ranks put in memory until their writer drops it;\n"
    "SIGTERM or SIGINT ends it. Transport: UCX (TCP, shared memory or RDMA as the\n"
    "hardware allows; UCX_* environment variables tune it). docs/checkpoints.md.\n";

volatile std::sig_atomic_t stopping = 0;

struct Failure : std::runtime_error {
  Failure(std::string code, const std::string &what) : std::runtime_error(what), code(code) {}
  std::string code;
};

/// Versions are numbers below 2^53 (a JSON number holds them exactly).
constexpr int64_t kMaxVersion = int64_t(1) << 53;

struct Key {
  /// version -> file -> bytes
  std::map<int64_t, std::map<std::string, std::string>> files;
  /// Committed versions' indexes (on the key's home volume).
  std::map<int64_t, std::string> committed;
  int64_t next = 0;
};

class Volume {
public:
  /// A volume that serves requests carrying `token` (any, when empty).
  explicit Volume(std::string token) : token_(std::move(token)) {}

  /// The reply to `request` (its header and payload).
  std::pair<json::Object, std::string> handle(const json::Object &q, std::string &data) {
    std::string op = q.getString("op").value_or("");
    if (!token_.empty()) {
      std::optional<std::string> given = q.getString("token");
      if (!given || !tokenMatches(token_, *given)) {
        ++refused_;
        throw Failure("unauthorized",
                      "refused a '" + op.substr(0, 32) + "' request: it carries " +
                          (given ? "a token that is not this volume's job token"
                                 : "no job token"));
      }
    }
    if (op == "stat")
      return {stat(), ""};
    if (op == "keys") {
      json::Array out;
      for (const auto &[name, k] : keys_)
        if (!k.committed.empty())
          out.push_back(name);
      return {json::Object{{"keys", std::move(out)}}, ""};
    }
    std::string name = text(q, "key");
    if (name.empty())
      throw Failure("bad-request", "got a request for a key with no name");
    if (op == "begin") {
      // The next version, or the one asked for (a checkpoint's step).
      if (q.get("at") && !inRange(q.getInteger("at")))
        throw Failure("bad-request", "got a version to begin out of range (0 to 2^53)");
      Key &k = keys_[name];
      if (!k.committed.empty())
        k.next = std::max(k.next, k.committed.rbegin()->first + 1);
      if (k.next >= kMaxVersion)
        throw Failure("bad-request", "key '" + name + "' has used every version");
      int64_t version = q.getInteger("at").value_or(k.next);
      k.next = std::max(k.next, version + 1);
      return {json::Object{{"version", version}}, ""};
    }
    if (op == "put") {
      int64_t version = version_(q);
      std::string file = text(q, "file");
      if (file.empty() || file.find('/') != std::string::npos)
        throw Failure("bad-request", "got a put of a file named '" + file + "'");
      // A truncated or garbled file never replaces what a version holds.
      try {
        checkSafetensors(data, file);
      } catch (const std::exception &e) {
        throw Failure("bad-request", std::string("refused a put: ") + e.what());
      }
      uint64_t n = data.size();
      received_ += n;
      keys_[name].files[version][file] = std::move(data);
      return {json::Object{{"bytes", n}}, ""};
    }
    if (op == "commit")
      return {commit(name, version_(q), q.getInteger("keep").value_or(0), data), ""};
    if (op == "drop") {
      drop(name, integer(q, "below"));
      return {json::Object{}, ""};
    }
    if (op == "versions") {
      json::Array out;
      auto it = keys_.find(name);
      if (it != keys_.end())
        for (const auto &[v, index] : it->second.committed)
          out.push_back(v);
      return {json::Object{{"versions", std::move(out)}}, ""};
    }
    if (op == "delete") {
      if (!keys_.count(name) || keys_[name].committed.empty())
        throw Failure("no-key", "has no key '" + name + "'");
      keys_.erase(name);
      return {json::Object{}, ""};
    }
    if (op == "index") {
      if (q.get("version") && !inRange(q.getInteger("version")))
        throw Failure("bad-request", "got a version out of range (0 to 2^53)");
      return index(name, q.getInteger("version"));
    }
    if (op == "read")
      return {json::Object{}, read(name, version_(q), text(q, "file"), data)};
    throw Failure("bad-request", "has no operation '" + op + "'");
  }

  /// Requests refused: without the job's token, or malformed.
  uint64_t refused_ = 0, malformed_ = 0;

private:
  std::string token_;
  std::map<std::string, Key> keys_;
  /// Bytes sent to readers, and put by writers, since the volume started.
  uint64_t served_ = 0, received_ = 0;

  static std::string text(const json::Object &q, const char *field) {
    std::optional<std::string> v = q.getString(field);
    if (!v)
      throw Failure("bad-request", std::string("got a request without '") + field + "'");
    return *v;
  }
  static bool inRange(std::optional<int64_t> v) { return v && *v >= 0 && *v < kMaxVersion; }
  static int64_t version_(const json::Object &q) {
    int64_t v = integer(q, "version");
    if (!inRange(v))
      throw Failure("bad-request", "got version " + std::to_string(v) + ", out of range (0 to 2^53)");
    return v;
  }
  static int64_t integer(const json::Object &q, const char *field) {
    std::optional<int64_t> v = q.getInteger(field);
    if (!v)
      throw Failure("bad-request", std::string("got a request without '") + field + "'");
    return *v;
  }

  json::Object stat() const {
    // What it holds, and the bytes it has served and received.
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    uint64_t bytes = 0, files = 0, committed = 0;
    for (const auto &[name, k] : keys_) {
      committed += k.committed.size();
      for (const auto &[v, fs] : k.files)
        for (const auto &[f, b] : fs)
          bytes += b.size(), ++files;
    }
    return json::Object{{"host", std::string(host)}, {"keys", keys_.size()},
                        {"files", files},            {"bytes", bytes},
                        {"committed", committed}, {"served", served_},
                        {"received", received_},  {"refused", refused_},
                        {"malformed", malformed_}};
  }

  json::Object commit(const std::string &name, int64_t version, int64_t keep,
                      std::string &index) {
    std::optional<json::Value> parsed = json::parse(index);
    const json::Object *root = parsed ? parsed->getAsObject() : nullptr;
    if (!root || !root->getObject("files"))
      throw Failure("bad-request", "refused to commit version " + std::to_string(version) +
                                       " of key '" + name +
                                       "': its index is not a checkpoint index (JSON with \"files\")");
    Key &k = keys_[name];
    if (!k.committed.empty() && k.committed.rbegin()->first > version)
      throw Failure("superseded", "version " + std::to_string(version) + " of key '" + name +
                                      "' is older than its committed version " +
                                      std::to_string(k.committed.rbegin()->first));
    // The version becomes visible whole: one insertion, after every file
    // is on its volume.
    k.committed[version] = std::move(index);
    while (keep > 0 && static_cast<int64_t>(k.committed.size()) > keep)
      k.committed.erase(k.committed.begin());
    return json::Object{{"oldest", k.committed.begin()->first}};
  }

  void drop(const std::string &name, int64_t below) {
    auto it = keys_.find(name);
    if (it == keys_.end())
      return;
    Key &k = it->second;
    k.files.erase(k.files.begin(), k.files.lower_bound(below));
    k.committed.erase(k.committed.begin(), k.committed.lower_bound(below));
    if (below == LLONG_MAX && k.committed.empty())
      keys_.erase(it);
  }

  std::pair<json::Object, std::string> index(const std::string &name,
                                             std::optional<int64_t> version) {
    auto it = keys_.find(name);
    if (it == keys_.end() || it->second.committed.empty())
      throw Failure("no-key", "has no key '" + name + "'");
    const auto &committed = it->second.committed;
    if (!version)
      return {json::Object{{"version", committed.rbegin()->first}}, committed.rbegin()->second};
    auto v = committed.find(*version);
    if (v == committed.end()) {
      std::string have;
      for (const auto &[n, index] : committed)
        have += (have.empty() ? "" : ", ") + std::to_string(n);
      throw Failure("no-version", "key '" + name + "' has no version " +
                                      std::to_string(*version) + "; it has " + have);
    }
    return {json::Object{{"version", *version}}, v->second};
  }

  std::string read(const std::string &name, int64_t version, const std::string &file,
                   const std::string &ranges) {
    const std::string *bytes = nullptr;
    auto k = keys_.find(name);
    if (k != keys_.end()) {
      auto v = k->second.files.find(version);
      if (v != k->second.files.end()) {
        auto f = v->second.find(file);
        if (f != v->second.end())
          bytes = &f->second;
      }
    }
    if (!bytes)
      throw Failure("stale", "holds no " + file + " of version " + std::to_string(version) +
                                 " of key '" + name +
                                 "' (its writer dropped that version after committing a "
                                 "newer one, or this volume restarted)");
    if (ranges.size() % 16)
      throw Failure("bad-request", "got malformed byte ranges");
    uint64_t total = 0;
    for (size_t i = 0; i < ranges.size(); i += 16) {
      uint64_t offset, n;
      std::memcpy(&offset, &ranges[i], 8);
      std::memcpy(&n, &ranges[i + 8], 8);
      if (offset > bytes->size() || n > bytes->size() - offset)
        throw Failure("bad-request", "got a read past the end of " + file);
      total += n;
      // A reader's runs are distinct bytes of the file.
      if (total > bytes->size())
        throw Failure("bad-request", "got a read of more bytes than " + file + " holds");
    }
    std::string out;
    out.reserve(total);
    for (size_t i = 0; i < ranges.size(); i += 16) {
      uint64_t offset, n;
      std::memcpy(&offset, &ranges[i], 8);
      std::memcpy(&n, &ranges[i + 8], 8);
      out.append(*bytes, offset, n);
    }
    served_ += out.size();
    return out;
  }
};

void onSignal(int) { stopping = 1; }

} // namespace

int main(int argc, char **argv) {
  long port = 7070;
  std::string bind;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--port" && i + 1 < argc) {
      char *end = nullptr;
      port = std::strtol(argv[++i], &end, 10);
      if (!end || *end || port < 0 || port > 65535) {
        std::fprintf(stderr, "tdx-volume: --port %s is not a port (0 to 65535)\n", argv[i]);
        return 2;
      }
    } else if (a == "--bind" && i + 1 < argc) {
      bind = argv[++i];
    } else {
      std::fprintf(stderr, "tdx-volume: unknown argument '%s'\n\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  std::signal(SIGTERM, onSignal);
  std::signal(SIGINT, onSignal);
  std::signal(SIGPIPE, SIG_IGN);
  try {
    std::string token = storeToken();
    ucx::Worker worker;
    uint16_t bound = worker.listen(static_cast<uint16_t>(port), bind);
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string name = bind.empty() ? host : bind;
    if (token.empty())
      std::fprintf(stderr,
                   "tdx-volume: warning: no job token (TDX_STORE_TOKEN): anyone who reaches "
                   "port %u can read, write and delete what this volume holds\n",
                   bound);
    std::printf("tdx-volume: serving on %s:%u (pid %d)\n", name.c_str(), bound, ::getpid());
    std::fflush(stdout);
    Volume volume(token);
    auto &inbox = worker.inbox(ucx::kRequest);
    while (!stopping) {
      worker.wait(ucx::Clock::now() + std::chrono::milliseconds(200));
      while (!inbox.empty()) {
        ucx::Message m = std::move(inbox.front());
        inbox.pop_front();
        std::optional<json::Value> parsed = json::parse(m.header);
        const json::Object *q = parsed ? parsed->getAsObject() : nullptr;
        json::Object reply;
        std::string data;
        try {
          if (!q)
            throw Failure("bad-request", "got a request whose header is not a JSON object");
          std::tie(reply, data) = volume.handle(*q, m.data);
        } catch (const Failure &f) {
          reply = json::Object{{"error", std::string(f.what())}, {"code", f.code}};
          if (f.code == "bad-request")
            ++volume.malformed_;
          // Refusals are logged: an operator sees who is knocking.
          if (f.code == "unauthorized" || f.code == "bad-request")
            std::fprintf(stderr, "tdx-volume: %s\n", f.what());
        } catch (const std::exception &e) {
          reply = json::Object{{"error", std::string(e.what())}, {"code", "internal"}};
        }
        reply["id"] = q ? q->getInteger("id").value_or(-1) : -1;
        if (m.replyTo)
          worker.send(m.replyTo, ucx::kReply, json::print(reply), std::move(data));
      }
    }
  } catch (const std::exception &e) {
    std::fprintf(stderr, "tdx-volume: %s\n", e.what());
    return 1;
  }
  return 0;
}
