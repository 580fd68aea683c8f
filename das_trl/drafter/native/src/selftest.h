// Self-checks of the drafter's containers (flat_map.h, pod_vector.h) against the standard library, at sizes where
// their large-table paths run (mapped pages, incremental doubling, mremap growth), and of a history snapshot's
// memory layout (snapshot.cc). For the tests; cheap.
#pragma once

#include <cstdint>
#include <string>

namespace das {

// Random inserts, updates and lookups of n keys (a FlatMap against std::unordered_map) and n appends (a PodVector
// against std::vector), checked all along. Returns an empty string when everything agrees, else what differs.
std::string selftest_containers(uint64_t seed, int64_t n);

// Builds a Snapshot over n random sequences that repeat each other's stretches (so that best-continuation paths are
// long) and checks its layout: the root is state 0, every suffix link points to a shorter state and every state's
// best continuation is either the next state in memory or one laid out before it (the chain layout that makes a
// draft's walk read memory in order). Returns "" when it holds, else what differs; sets sequential_share to the
// share of states with a best continuation whose continuation is the next state.
std::string selftest_snapshot_layout(uint64_t seed, int64_t n, double& sequential_share);

}  // namespace das
