//===- MeshTest.cpp - the mesh's group arithmetic, without MPI ------------===//

#include "tdx/Runtime/Mesh.h"

#include <gtest/gtest.h>

using tdx::rt::Mesh;

namespace {

TEST(MeshTest, APermutationsPeersAreWhomEachRankSendsToAndReceivesFrom) {
  // The ring of 4 (source, target pairs): rank 1 sends to 2, receives from 0.
  std::vector<int64_t> ring = {0, 1, 1, 2, 2, 3, 3, 0};
  EXPECT_EQ(Mesh::permutePeers(ring, 1), std::make_pair(2, 0));
  EXPECT_EQ(Mesh::permutePeers(ring, 0), std::make_pair(1, 3));
  // A shift that drops the last rank's value: rank 0 receives nothing
  // (zeros), rank 3 sends nothing.
  std::vector<int64_t> shift = {0, 1, 1, 2, 2, 3};
  EXPECT_EQ(Mesh::permutePeers(shift, 0), std::make_pair(1, -1));
  EXPECT_EQ(Mesh::permutePeers(shift, 3), std::make_pair(-1, 2));
  // A rank its own peer.
  EXPECT_EQ(Mesh::permutePeers({2, 2}, 2), std::make_pair(2, 2));
  EXPECT_EQ(Mesh::permutePeers({}, 0), std::make_pair(-1, -1));
}

} // namespace
