# The verbs provider: the software verbs model (tests only, never linked into ferryd), its own
# tests, the provider's tests on it, and the real-NIC checks (label rdma: host and CUDA memory,
# the latter by DMA-BUF; they skip here, saying why).
add_library(ferry_verbs_model STATIC ${CMAKE_CURRENT_SOURCE_DIR}/verbs_model/verbs_model.cc)
target_link_libraries(ferry_verbs_model PUBLIC ferry_verbs ferry_peer_memory absl::synchronization
  Threads::Threads)

ferry_test(verbs_model_test LABELS unit LIBS ferry_verbs_model ferry_memory)
ferry_test(verbs_provider_test LABELS unit LIBS ferry_verbs_model ferry_providers ferry_memory)
ferry_test(verbs_events_test LABELS unit LIBS ferry_verbs_model)
ferry_test(verbs_hardware_test LABELS rdma LIBS ferry_verbs ferry_memory)
# Rails on the model: four devices a node, one op striped over them, a link lost mid-transfer
# (StripedOp, FairQueue and RailLedger from the engine).
ferry_test(verbs_rails_test LABELS unit LIBS ferry_verbs_model ferry_server)
