// tests/core/test_small_vector.cpp — SmallVector against std::vector, and the bytes it lets go.
#include <catch2/catch.hpp>

#include <memory>
#include <random>
#include <vector>

#include "trainmem/core/small_vector.hpp"

namespace {
template <class T, std::size_t N>
std::vector<T> contents(const trainmem::SmallVector<T, N>& v) {
  return std::vector<T>(v.begin(), v.end());
}
}  // namespace

TEST_CASE("SmallVector: random pushes, resizes and clears give std::vector's contents", "[core][small_vector]") {
  std::mt19937 rng(7);
  trainmem::SmallVector<int, 3> small;
  std::vector<int> reference;
  for (int step = 0; step < 2000; ++step) {
    const int action = static_cast<int>(rng() % 10);
    if (action < 6) {
      const int value = static_cast<int>(rng() % 1000);
      small.push_back(value);
      reference.push_back(value);
    } else if (action < 9) {
      const std::size_t count = rng() % 8;
      small.resize(count);
      reference.resize(count);
    } else {
      small.clear();
      reference.clear();
    }
    REQUIRE(small.size() == reference.size());
    REQUIRE(contents(small) == reference);
  }
  const trainmem::SmallVector<int, 3> counted(4);  // one integer is a count
  CHECK(contents(counted) == std::vector<int>{0, 0, 0, 0});
  trainmem::SmallVector<int, 3> listed{1, 2, 3, 4, 5};
  CHECK(contents(listed) == std::vector<int>{1, 2, 3, 4, 5});
  CHECK(listed.front() == 1);
  CHECK(listed.back() == 5);
  trainmem::SmallVector<int, 3> moved(std::move(listed));
  CHECK(contents(moved) == std::vector<int>{1, 2, 3, 4, 5});
  CHECK(listed.empty());  // NOLINT(bugprone-use-after-move): a moved-from SmallVector is empty
  trainmem::SmallVector<int, 3> copied = moved;
  CHECK(contents(copied) == contents(moved));
}

TEST_CASE("SmallVector: a dropped element is destroyed at once, inline or on the heap", "[core][small_vector]") {
  for (const std::size_t count : {2u, 5u}) {  // inline, and spilled to the heap
    auto held = std::make_shared<int>(1);
    trainmem::SmallVector<std::shared_ptr<int>, 3> v;
    for (std::size_t i = 0; i < count; ++i) v.push_back(held);
    CHECK(held.use_count() == static_cast<long>(count) + 1);
    v.resize(1);
    CHECK(held.use_count() == 2);
    v.clear();
    CHECK(held.use_count() == 1);
    for (std::size_t i = 0; i < count; ++i) v.push_back(held);
    trainmem::SmallVector<std::shared_ptr<int>, 3> taken(std::move(v));
    CHECK(held.use_count() == static_cast<long>(count) + 1);  // moved, not copied
  }
}

namespace {
/// Counts its copies; moves are free.
struct Counted {
  static inline int copies = 0;
  Counted() = default;
  Counted(const Counted&) { ++copies; }
  Counted(Counted&&) noexcept = default;
  Counted& operator=(const Counted&) {
    ++copies;
    return *this;
  }
  Counted& operator=(Counted&&) noexcept = default;
};
}  // namespace

TEST_CASE("SmallVector: listed temporaries are moved in, named values copied once", "[core][small_vector]") {
  const Counted named;
  Counted::copies = 0;
  const trainmem::SmallVector<Counted, 3> inline_list{named, Counted(), Counted()};
  CHECK(Counted::copies == 1);
  Counted::copies = 0;
  const trainmem::SmallVector<Counted, 3> heap_list{Counted(), named, Counted(), named};
  CHECK(heap_list.size() == 4);
  CHECK(Counted::copies == 2);
}
