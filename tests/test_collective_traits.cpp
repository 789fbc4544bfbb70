// The collective traits table pinned to hand-computed values (n = 1, 2, 8).
#include <doctest/doctest.h>

#include "cuboid/core/collective_traits.hpp"

using namespace cuboid;

namespace {
// The table is constexpr: these hold at compile time too.
static_assert(ring_bytes(Collective::all_reduce, 8) == 1.75);
static_assert(ring_steps(Collective::all_reduce, 8) == 14.0);
static_assert(bus_factor(Collective::broadcast, 1) == 0.0);
}  // namespace

TEST_CASE("collective traits: names") {
  CHECK(traits(Collective::all_reduce).name == "all_reduce");
  CHECK(traits(Collective::reduce_scatter).name == "reduce_scatter");
  CHECK(traits(Collective::all_gather).name == "all_gather");
  CHECK(traits(Collective::broadcast).name == "broadcast");
  CHECK(traits(Collective::send_recv).name == "send_recv");
}

TEST_CASE("collective traits: all_reduce moves 2(n-1)/n of the size in 2(n-1) steps") {
  CHECK(ring_bytes(Collective::all_reduce, 1) == 0.0);
  CHECK(ring_bytes(Collective::all_reduce, 2) == 1.0);
  CHECK(ring_bytes(Collective::all_reduce, 8) == 1.75);
  CHECK(ring_steps(Collective::all_reduce, 1) == 0.0);
  CHECK(ring_steps(Collective::all_reduce, 2) == 2.0);
  CHECK(ring_steps(Collective::all_reduce, 8) == 14.0);
  CHECK(bus_factor(Collective::all_reduce, 1) == 0.0);
  CHECK(bus_factor(Collective::all_reduce, 2) == 1.0);
  CHECK(bus_factor(Collective::all_reduce, 8) == 1.75);
}

TEST_CASE("collective traits: reduce_scatter and all_gather move (n-1)/n in n-1 steps") {
  for (Collective c : {Collective::reduce_scatter, Collective::all_gather}) {
    CAPTURE(traits(c).name);
    CHECK(ring_bytes(c, 1) == 0.0);
    CHECK(ring_bytes(c, 2) == 0.5);
    CHECK(ring_bytes(c, 8) == 0.875);
    CHECK(ring_steps(c, 1) == 0.0);
    CHECK(ring_steps(c, 2) == 1.0);
    CHECK(ring_steps(c, 8) == 7.0);
    CHECK(bus_factor(c, 1) == 0.0);
    CHECK(bus_factor(c, 2) == 0.5);
    CHECK(bus_factor(c, 8) == 0.875);
  }
}

TEST_CASE("collective traits: broadcast moves the size in n-1 steps, send_recv in one") {
  CHECK(ring_bytes(Collective::broadcast, 1) == 1.0);
  CHECK(ring_bytes(Collective::broadcast, 2) == 1.0);
  CHECK(ring_bytes(Collective::broadcast, 8) == 1.0);
  CHECK(ring_steps(Collective::broadcast, 1) == 0.0);
  CHECK(ring_steps(Collective::broadcast, 2) == 1.0);
  CHECK(ring_steps(Collective::broadcast, 8) == 7.0);
  CHECK(bus_factor(Collective::broadcast, 1) == 0.0);  // a group of one moves nothing
  CHECK(bus_factor(Collective::broadcast, 8) == 1.0);
  CHECK(ring_bytes(Collective::send_recv, 2) == 1.0);
  CHECK(ring_steps(Collective::send_recv, 1) == 1.0);
  CHECK(ring_steps(Collective::send_recv, 2) == 1.0);
  CHECK(ring_steps(Collective::send_recv, 8) == 1.0);
  CHECK(bus_factor(Collective::send_recv, 1) == 0.0);
  CHECK(bus_factor(Collective::send_recv, 2) == 1.0);
  CHECK(bus_factor(Collective::send_recv, 8) == 1.0);
}
