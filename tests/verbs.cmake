# The verbs provider: the software verbs model (tests only, never linked into ferryd), its own
# tests, the provider's tests on it, and the real-NIC checks (label rdma: host and CUDA memory,
# the latter by DMA-BUF; they skip here, saying why).
add_library(ferry_verbs_model STATIC ${CMAKE_CURRENT_SOURCE_DIR}/verbs_model/verbs_model.cc)
target_link_libraries(ferry_verbs_model PUBLIC ferry_verbs ferry_peer_memory absl::synchronization
  Threads::Threads)

ferry_test(verbs_model_test LABELS unit LIBS ferry_verbs_model ferry_memory)
ferry_test(verbs_provider_test LABELS unit LIBS ferry_verbs_model ferry_providers ferry_memory)
ferry_test(verbs_events_test LABELS unit LIBS ferry_verbs_model)
# The real-NIC tests (label rdma): on a machine with an RDMA device, and in `make test-rdma`
# (tests/rdma/: Soft-RoCE in QEMU guests). ctest names them "<target>.<Suite>.<Case>", so
# `ctest -R verbs_hardware` finds them (gtest's names alone are VerbsHardwareTest.*).
# fabric_conformance_rdma_test: the provider conformance suite over the first device with an
# active port (FERRY_CONFORMANCE_ON_RDMA_NIC in fabric_conformance_test.cc).
function(ferry_rdma_test name source)
  cmake_parse_arguments(T "" "" "LIBS;DEFINES" ${ARGN})
  add_executable(${name} ${source})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_compile_definitions(${name} PRIVATE ${T_DEFINES})
  if(FERRY_TSAN_ABSL_SHIM)
    target_link_libraries(${name} PRIVATE ferry_tsan_absl_sync)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 TEST_PREFIX "${name}." PROPERTIES LABELS rdma)
endfunction()
ferry_rdma_test(verbs_hardware_test verbs_hardware_test.cc LIBS ferry_verbs ferry_memory)
ferry_rdma_test(fabric_conformance_rdma_test fabric_conformance_test.cc
                LIBS ferry_tcp ferry_verbs_model ferry_fake_fabric
                DEFINES FERRY_CONFORMANCE_ON_RDMA_NIC)
# Rails on the model: four devices a node, one op striped over them, a link lost mid-transfer
# (StripedOp, FairQueue and RailLedger from the engine).
ferry_test(verbs_rails_test LABELS unit LIBS ferry_verbs_model ferry_server)
# test-rdma's KV block-list driver (tests/rdma/kv_blocks.cc): two agents in two guests move
# scattered blocks between block lists, READ and WRITE; the guests have no Python.
add_executable(rdma_kv_blocks ${CMAKE_CURRENT_SOURCE_DIR}/rdma/kv_blocks.cc)
target_link_libraries(rdma_kv_blocks PRIVATE ferry_tensor_client ferry_client absl::str_format
                      absl::strings absl::time)
# And its small-WRITE latency beside ib_write_lat (tests/rdma/write_latency.cc): one client
# kept connected, as perftest keeps its QP.
add_executable(rdma_write_latency ${CMAKE_CURRENT_SOURCE_DIR}/rdma/write_latency.cc)
target_link_libraries(rdma_write_latency PRIVATE ferry_client absl::str_format absl::strings
                      absl::time)
