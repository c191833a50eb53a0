//===- StoreTransportTest.cpp - the networked store's pieces, alone -------===//
//
// What include/tdx/Store/Volumes.h builds on, without a volume process:
// UCX request and reply messages between two workers of this process (a
// small payload, and one large enough for UCX's rendezvous protocol), a
// connection refused, and a checkpoint read through a FileOpener whose
// files are in memory, as a version's files on volumes are read.
//
//===----------------------------------------------------------------------===//

#include "tdx/StateFormat/Checkpoint.h"
#include "tdx/Store/Ucx.h"
#include "tdx/Store/Volumes.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

using namespace tdx::rt;

namespace {

ucx::Clock::time_point in(int seconds) {
  return ucx::Clock::now() + std::chrono::seconds(seconds);
}

TEST(Ucx, RequestsAndRepliesCarryHeadersAndLargePayloadsWhole) {
  ucx::Worker server, client;
  uint16_t port = server.listen(0);
  ASSERT_GT(port, 0);
  void *ep = client.connect("localhost", port);
  for (size_t bytes : {size_t(16), size_t(8) << 20}) {
    std::string payload(bytes, '\0');
    for (size_t i = 0; i < bytes; ++i)
      payload[i] = static_cast<char>(i * 131 + 7);
    client.send(ep, ucx::kRequest, "{\"op\": \"echo\"}", payload);
    // The server answers on the endpoint the request came in on.
    auto &requests = server.inbox(ucx::kRequest);
    auto &replies = client.inbox(ucx::kReply);
    bool done = false;
    auto deadline = in(20);
    while (!done && ucx::Clock::now() < deadline) {
      server.progress();
      client.progress();
      if (!requests.empty()) {
        ucx::Message m = std::move(requests.front());
        requests.pop_front();
        EXPECT_EQ(m.header, "{\"op\": \"echo\"}");
        ASSERT_NE(m.replyTo, nullptr);
        server.send(m.replyTo, ucx::kReply, "ok", std::move(m.data));
      }
      done = !replies.empty();
    }
    ASSERT_TRUE(done) << bytes << " bytes: no reply";
    EXPECT_EQ(replies.front().header, "ok");
    EXPECT_TRUE(replies.front().data == payload) << bytes << " bytes came back changed";
    replies.pop_front();
  }
  EXPECT_EQ(client.failure(ep), "");
}

TEST(Ucx, AConnectionNobodyTakesFailsInsteadOfWaiting) {
  ucx::Worker client;
  void *ep = client.connect("localhost", 1);
  client.send(ep, ucx::kRequest, "{}", "");
  EXPECT_TRUE(client.waitUntil([&] { return !client.failure(ep).empty(); }, in(20)));
  EXPECT_THROW(client.connect("no-such-host.invalid", 7070), std::runtime_error);
}

/// A file held in memory, as a volume holds one.
class MemoryFile final : public TensorStore::OpenFile {
public:
  explicit MemoryFile(std::string bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t offset, uint64_t n, void *out) const override {
    ASSERT_LE(offset + n, bytes_.size());
    std::memcpy(out, bytes_.data() + offset, n);
    ++reads;
  }
  mutable int reads = 0;

private:
  std::string bytes_;
};

TEST(Volumes, AVersionIsACheckpointWhoseFilesComeFromAnOpener) {
  // Two writers' boxes of an 8 x 6 tensor, split on rows, in memory.
  std::vector<float> w(48);
  std::iota(w.begin(), w.end(), 0.f);
  PendingCheckpoint p{"ucx://h1:7070/k", "", newCheckpointId(3), 3};
  std::map<std::string, std::string> files;
  std::vector<std::string> parts;
  for (int r = 0; r < 2; ++r) {
    std::string name = "rank-0000" + std::to_string(r) + ".safetensors";
    std::vector<BoxToWrite> boxes{{"w", DType::F32, {8, 6}, {4 * r, 0}, {4, 6}, &w[24 * r]}};
    WrittenFile written;
    files[name] = serializeSafetensors(checkpointTensors(boxes),
                                       {{"tdx.checkpoint", p.id}, {"tdx.file", name}}, written);
    EXPECT_EQ(written.size, files[name].size());
    parts.push_back(checkpointPart(name, written, boxes, "h" + std::to_string(r + 1) + ":7070"));
  }
  std::string index = checkpointIndex(p, parts, {{"tdx.store", "dict"}});
  EXPECT_NE(index.find("\"volume\": \"h2:7070\""), std::string::npos) << index;
  std::map<std::string, std::shared_ptr<MemoryFile>> opened;
  TensorStore store("ucx://h1:7070/k/step-00000003", index,
                    [&](const std::string &name, uint64_t size) {
                      EXPECT_EQ(size, files.at(name).size());
                      return opened[name] = std::make_shared<MemoryFile>(files.at(name));
                    });
  EXPECT_EQ(store.metadata().at("step"), "3");
  // Rows 3..5, columns 2..4: across both writers' files.
  float box[3 * 3];
  store.readBox("w", {3, 2}, {3, 3}, box);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      EXPECT_EQ(box[i * 3 + j], w[(3 + i) * 6 + 2 + j]);
  EXPECT_EQ(store.bytesRead(), 9u * 4);
  // A file of another version (another id) is refused by its header.
  std::string other = files["rank-00001.safetensors"];
  other.replace(other.find(p.id), p.id.size(), newCheckpointId(3));
  EXPECT_THROW(TensorStore("v", index,
                           [&](const std::string &name, uint64_t) {
                             return std::make_shared<MemoryFile>(
                                 name == "rank-00001.safetensors" ? other : files.at(name));
                           }),
               std::runtime_error);
}

TEST(Volumes, PathsAreNamed) {
  EXPECT_TRUE(isVolumePath("ucx://h1:7070,h2:7070/k"));
  EXPECT_FALSE(isVolumePath("/dev/shm/store"));
  try {
    volumeKeys("ucx://h1:port");
    FAIL() << "a port that is not a number was taken";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("'h1:port' in ucx://h1:port is not a volume's HOST:PORT"),
              std::string::npos)
        << e.what();
  }
}

} // namespace
