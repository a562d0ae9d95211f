// Byte counts as the environment variables, the tool's options and the
// simulated driver take them: exact, and never a silent wrap-around.
#include "util/byte_size.hpp"

#include <gtest/gtest.h>

#include <cstdint>

using cuemm::util::parse_byte_size;

TEST(ByteSize, WholeNumbersAndBinarySuffixesAreExact) {
  EXPECT_EQ(parse_byte_size("0"), 0u);
  EXPECT_EQ(parse_byte_size("1073741824"), std::size_t{1} << 30);
  EXPECT_EQ(parse_byte_size("512B"), 512u);
  EXPECT_EQ(parse_byte_size("4k"), std::size_t{4} << 10);
  EXPECT_EQ(parse_byte_size("512M"), std::size_t{512} << 20);
  EXPECT_EQ(parse_byte_size("2GiB"), std::size_t{2} << 30);
  EXPECT_EQ(parse_byte_size("3tb"), std::size_t{3} << 40);
  // Beyond 2^53, where a double would round: still the exact count.
  EXPECT_EQ(parse_byte_size("18446744073709551615"), SIZE_MAX);
  EXPECT_EQ(parse_byte_size("16777215T"), std::size_t{16777215} << 40);
}

TEST(ByteSize, FractionsOfAUnit) {
  EXPECT_EQ(parse_byte_size("1.5G"), std::size_t{3} << 29);
  EXPECT_EQ(parse_byte_size(".5M"), std::size_t{1} << 19);
  EXPECT_EQ(parse_byte_size("2."), 2u);
}

TEST(ByteSize, AnythingElseIsRefusedRatherThanReadAsSomeOtherCount) {
  for (const char* text : {"", ".", "M", "-1", "+5", " 5", "5 ", "12 MiB", "1e20", "1e3", "0x10", "inf", "nan",
                           "3P", "5iB", "5KiBs", "lots"})
    EXPECT_EQ(parse_byte_size(text), std::nullopt) << "'" << text << "'";
}

TEST(ByteSize, CountsOf2To64BytesOrMoreDoNotWrap) {
  EXPECT_EQ(parse_byte_size("18446744073709551616"), std::nullopt);
  EXPECT_EQ(parse_byte_size("99999999999999999999999"), std::nullopt);
  EXPECT_EQ(parse_byte_size("16777216T"), std::nullopt);
  EXPECT_EQ(parse_byte_size("16777216.0T"), std::nullopt);
  EXPECT_EQ(parse_byte_size("17179869184G"), std::nullopt);
}
