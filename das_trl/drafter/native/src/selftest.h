// Self-checks of the drafter's containers (flat_map.h, pod_vector.h) against the standard library, at sizes where
// their large-table paths run (mapped pages, incremental doubling, mremap growth). For the tests; cheap.
#pragma once

#include <cstdint>
#include <string>

namespace das {

// Random inserts, updates and lookups of n keys (a FlatMap against std::unordered_map) and n appends (a PodVector
// against std::vector), checked all along. Returns an empty string when everything agrees, else what differs.
std::string selftest_containers(uint64_t seed, int64_t n);

}  // namespace das
