#include "base/json_writer.h"

#include <limits>

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(JsonWriterTest, NestedObjectsAndArraysGetCommas) {
  JsonWriter json;
  json.BeginObject();
  json.Key("a").Int(1);
  json.Key("b").BeginArray().Int(-2).Uint(3).Bool(true).Bool(false).Null().EndArray();
  json.Key("c").BeginObject().Key("d").String("e").EndObject();
  json.Key("empty").BeginArray().EndArray();
  json.EndObject();
  EXPECT_EQ(json.str(),
            R"({"a":1,"b":[-2,3,true,false,null],"c":{"d":"e"},"empty":[]})");
  EXPECT_TRUE(json.complete());
}

TEST(JsonWriterTest, EscapesStrings) {
  EXPECT_EQ(JsonWriter::Quote("plain"), R"("plain")");
  EXPECT_EQ(JsonWriter::Quote("q\"b\\s/"), R"("q\"b\\s/")");
  EXPECT_EQ(JsonWriter::Quote("\n\r\t\b\f"), R"("\n\r\t\b\f")");
  EXPECT_EQ(JsonWriter::Quote(std::string("\x01\x1f", 2)), R"("\u0001\u001f")");
  EXPECT_EQ(JsonWriter::Quote(std::string("nul\0x", 5)), R"("nul\u0000x")");
  EXPECT_EQ(JsonWriter::Quote("GPU ↔ NIC"), "\"GPU ↔ NIC\"");  // UTF-8 unchanged
}

TEST(JsonWriterTest, KeysAreEscapedToo) {
  JsonWriter json;
  json.BeginObject().Key("a\"b").String("x").EndObject();
  EXPECT_EQ(json.str(), R"({"a\"b":"x"})");
}

TEST(JsonWriterTest, NumbersRoundTripAndNonFiniteIsNull) {
  JsonWriter json;
  json.BeginArray()
      .Double(0.1)
      .Double(200)
      .Double(31.507692)
      .Double(std::numeric_limits<double>::quiet_NaN())
      .Double(std::numeric_limits<double>::infinity())
      .Int(std::numeric_limits<int64_t>::min())
      .EndArray();
  EXPECT_EQ(json.str(), "[0.1,200,31.507692,null,null,-9223372036854775808]");
}

TEST(JsonWriterTest, OptionalsWriteNull) {
  JsonWriter json;
  json.BeginObject()
      .Key("n").OptionalInt(std::nullopt)
      .Key("i").OptionalInt(4)
      .Key("s").OptionalString(std::nullopt)
      .EndObject();
  EXPECT_EQ(json.str(), R"({"n":null,"i":4,"s":null})");
}

}  // namespace
}  // namespace ferry
