// trainmem/state/checksum.hpp — CRC-32 (IEEE 802.3, the polynomial of zlib and PNG).
//
// State files carry a CRC-32 over their header fields and every entry, so a flipped
// bit or a torn write is reported as corruption instead of loading wrong weights. The
// value is incremental: feed the bytes in any number of pieces.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace trainmem {

/// \brief Running CRC-32; `value()` equals zlib's crc32 over the bytes fed so far.
class Crc32 {
 public:
  void update(const void* data, std::size_t size) {
    const auto* p = static_cast<const std::uint8_t*>(data);
    std::uint32_t c = crc_;
    for (std::size_t i = 0; i < size; ++i) c = table()[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
    crc_ = c;
  }
  std::uint32_t value() const { return crc_ ^ 0xFFFFFFFFu; }

 private:
  static const std::array<std::uint32_t, 256>& table() {
    static constexpr std::array<std::uint32_t, 256> kTable = [] {
      std::array<std::uint32_t, 256> t{};
      for (std::uint32_t n = 0; n < 256; ++n) {
        std::uint32_t c = n;
        for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        t[n] = c;
      }
      return t;
    }();
    return kTable;
  }
  std::uint32_t crc_ = 0xFFFFFFFFu;
};

}  // namespace trainmem
