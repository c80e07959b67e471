#include "client/proto_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "ferry/v1/agent.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"

namespace ferry::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ProtoToJsonTest, SixtyFourBitIntegersAreBareNumbers) {
  ferry::v1::GetInfoResponse info;
  info.set_host_pool_bytes((uint64_t{1} << 53) + 1);  // a double cannot hold this one
  info.set_transfers_done(std::numeric_limits<uint64_t>::max());
  std::string json = ProtoToJson(info);
  EXPECT_THAT(json, HasSubstr(R"("host_pool_bytes":9007199254740993)"));
  EXPECT_THAT(json, HasSubstr(R"("transfers_done":18446744073709551615)"));
  // Defaults are printed too, under the proto names.
  EXPECT_THAT(json, HasSubstr(R"("host_pool_used_bytes":0)"));
  EXPECT_THAT(json, HasSubstr(R"("node":"")"));
}

TEST(ProtoToJsonTest, StringsThatLookLikeNumbersStayStrings) {
  ferry::v1::BufferInfo buffer;
  buffer.set_id(7);
  buffer.set_name("123");
  buffer.set_persist(true);
  std::string json = ProtoToJson(buffer);
  EXPECT_THAT(json, HasSubstr(R"("id":7,"name":"123")"));
  EXPECT_THAT(json, HasSubstr(R"("owner":"","persist":true)"));
}

TEST(ProtoToJsonTest, EnumsByName) {
  ferry::v1::TransferResult result;
  EXPECT_THAT(ProtoToJson(result), HasSubstr(R"("state":"TRANSFER_STATE_UNSPECIFIED")"));
  result.set_state(ferry::v1::FAILED);
  result.set_code(-3);
  EXPECT_THAT(ProtoToJson(result), HasSubstr(R"("state":"FAILED","code":-3)"));
  // An agent newer than this ferryctl may send a state it has no name for.
  result.set_state(static_cast<ferry::v1::TransferState>(42));
  EXPECT_THAT(ProtoToJson(result), HasSubstr(R"("state":42)"));
}

TEST(ProtoToJsonTest, RepeatedFields) {
  ferry::v1::GetInfoResponse info;
  EXPECT_THAT(ProtoToJson(info), HasSubstr(R"("gpus":[],"bounce_pools":[])"));
  info.add_providers("tcp");
  info.add_providers("verbs");
  info.add_gpus()->set_index(0);
  info.add_gpus()->set_index(1);
  std::string json = ProtoToJson(info);
  EXPECT_THAT(json, HasSubstr(R"("providers":["tcp","verbs"])"));
  EXPECT_THAT(json, HasSubstr(R"("gpus":[{"index":0,)"));
  EXPECT_THAT(json, HasSubstr(R"(},{"index":1,)"));
}

TEST(ProtoToJsonTest, NestedMessagesOnlyWhenSet) {
  ferry::v1::BufferInfo buffer;
  buffer.mutable_shm()->set_path("/dev/shm/ferry");
  buffer.mutable_shm()->set_length(uint64_t{1} << 40);
  std::string json = ProtoToJson(buffer);
  EXPECT_THAT(json,
              HasSubstr(R"("shm":{"path":"/dev/shm/ferry","offset":0,"length":1099511627776,)"
                        R"("fd_socket":""})"));
  EXPECT_THAT(json, Not(HasSubstr(R"("gpu")")));

  ferry::v1::AllocBufferResponse response;
  *response.mutable_buffer() = buffer;
  EXPECT_EQ(ProtoToJson(response), "{\"buffer\":" + json + "}");
}

TEST(ProtoToJsonTest, BytesAsBase64) {
  ferry::v1::GpuMapping gpu;
  gpu.set_handle(std::string("\x00\xff\x10", 3));
  EXPECT_THAT(ProtoToJson(gpu), HasSubstr(R"("handle":"AP8Q")"));
}

TEST(ProtoToJsonTest, DoublesAsNumbers) {
  ferry::v1::GpuInfo gpu;
  gpu.set_pool_fragmentation(0.25);
  EXPECT_THAT(ProtoToJson(gpu), HasSubstr(R"("pool_fragmentation":0.25)"));
  gpu.set_pool_fragmentation(std::nan(""));
  EXPECT_THAT(ProtoToJson(gpu), HasSubstr(R"("pool_fragmentation":"NaN")"));
}

// protobuf's own parser reads the output back to the same message: the field names, enum
// names, base64 and numbers are what the JSON mapping expects.
TEST(ProtoToJsonTest, ProtobufParsesItBack) {
  ferry::v1::TransferResult result;
  result.set_transfer_id((uint64_t{1} << 60) + 3);
  result.set_state(ferry::v1::SUCCEEDED);
  result.set_message("done \"quoted\"\n");
  result.set_ops_total(2);
  ferry::v1::OpResult* op = result.add_ops();
  op->set_index(1);
  op->set_bytes(uint64_t{5} << 33);
  ferry::v1::Leg* leg = op->add_legs();
  leg->set_side("remote");
  leg->set_mode("staged");
  leg->set_chunks(4);
  std::string json = ProtoToJson(result);

  ferry::v1::TransferResult parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) << json;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(result, parsed))
      << json << "\n"
      << parsed.DebugString();
}

}  // namespace
}  // namespace ferry::client
