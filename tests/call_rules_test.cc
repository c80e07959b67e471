// The local access table (server/local/call_rules.h): every Agent and Tensors RPC has a row,
// so a new RPC cannot ship without someone deciding who may make it; operator calls are
// refused to an ordinary uid and allowed to root, the admin group and local_tcp callers.

#include "server/local/call_rules.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ferry/v1/agent.grpc.pb.h"
#include "ferry/v1/tensor.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/local/local_callers.h"

namespace ferry::server {
namespace {

using ::testing::HasSubstr;

void ExpectEveryMethodHasARule(const google::protobuf::ServiceDescriptor* service) {
  ASSERT_NE(service, nullptr);
  EXPECT_GT(service->method_count(), 5);
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string call = absl::StrCat(service->name(), ".", service->method(i)->name());
    EXPECT_NE(FindCallRule(call), nullptr) << call << " has no row in call_rules.cc";
  }
}

TEST(CallRulesTest, EveryLocalRpcHasARule) {
  ExpectEveryMethodHasARule(
      ferry::v1::GetInfoRequest::descriptor()->file()->FindServiceByName("Agent"));
  ExpectEveryMethodHasARule(
      ferry::v1::SendRequest::descriptor()->file()->FindServiceByName("Tensors"));
}

TEST(CallRulesTest, RowsNameRealCallsOnce) {
  for (const CallRuleRow& row : CallRules()) {
    EXPECT_EQ(FindCallRule(row.call), &row) << row.call << " is listed twice";
  }
}

// The operator guide's table is the agent's: every row the same call, rule and words, in
// the same order, and no row the agent does not have.
TEST(CallRulesTest, TheOperatorGuideListsEveryRuleAsTheAgentHasIt) {
  std::ifstream guide(FERRY_SOURCE_DIR "/docs/operator-guide.md");
  ASSERT_TRUE(guide.good());
  std::vector<std::string> documented;
  std::string line;
  while (std::getline(guide, line)) {
    if (absl::StartsWith(line, "| `Agent.") || absl::StartsWith(line, "| `Tensors.") ||
        absl::StartsWith(line, "| `TransferSocket.") || absl::StartsWith(line, "| `FdSocket.")) {
      documented.push_back(line);
    }
  }
  std::vector<std::string> expected;
  for (const CallRuleRow& row : CallRules()) {
    expected.push_back(
        absl::StrCat("| `", row.call, "` | ", CallRuleName(row.rule), " | ", row.what, " |"));
  }
  EXPECT_EQ(documented, expected);
}

TEST(CallRulesTest, OperatorCallsNeedRootTheAdminGroupOrTls) {
  const LocalCallers callers(/*admin_group=*/4242);
  const LocalCaller tenant{1000, 1000, 1}, root{0, 0, 1}, admin{1001, 4242, 1};
  absl::Status refused = callers.Authorize(tenant, "Agent.SetPolicy");
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.message(), HasSubstr("Agent.SetPolicy is an operator call"));
  EXPECT_THAT(refused.message(), HasSubstr("uid 1000"));
  EXPECT_TRUE(callers.Authorize(root, "Agent.SetPolicy").ok());
  EXPECT_TRUE(callers.Authorize(admin, "Agent.AddPeer").ok());
  EXPECT_TRUE(callers.Authorize(std::nullopt, "Agent.SetNicState").ok());  // local_tcp
  EXPECT_TRUE(callers.Authorize(tenant, "Agent.GetPolicy").ok());
  EXPECT_EQ(callers.Authorize(tenant, "Agent.NoSuchCall").code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(callers.SeesAll(tenant));
  EXPECT_TRUE(callers.SeesAll(root));
  EXPECT_TRUE(callers.SeesAll(std::nullopt));
  EXPECT_EQ(LocalCallers::OwnerUid(tenant), 1000);
  EXPECT_EQ(LocalCallers::OwnerUid(std::nullopt), -1);
}

}  // namespace
}  // namespace ferry::server
