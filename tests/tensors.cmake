# Tensors: tagged Send/Recv, KV-block notifications (C++), the Python package (pytest) and
# the examples, all against real agents.
ferry_test(tensor_integration_test LABELS integration LIBS ferry_launch ferry_tensor_client)
ferry_test(tensor_client_lifetime_test LABELS integration LIBS ferry_launch ferry_tensor_client)
# Block lists over entries and strided runs (issue 46): head slices, pairs of unequal
# lengths, a peer that does not answer ResolveBlocks within the move's timeout.
ferry_test(block_entries_test LABELS integration LIBS ferry_launch ferry_tensor_client)
add_dependencies(block_entries_test ferryd)

if(TARGET ferry_python)
  # The Python side finds the package in the build tree and the agent through $FERRYD.
  set(FERRY_PY_ENV "PYTHONPATH=${FERRY_PYTHONPATH}" "FERRYD=$<TARGET_FILE:ferryd>")
  add_test(NAME python_tensors
           COMMAND ${FERRY_PYTHON} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_SOURCE_DIR}/python)
  add_test(NAME example_grad_exchange
           COMMAND ${FERRY_PYTHON} ${PROJECT_SOURCE_DIR}/examples/grad_exchange.py)
  add_test(NAME example_kv_stream
           COMMAND ${FERRY_PYTHON} ${PROJECT_SOURCE_DIR}/examples/kv_stream.py)
  # Paged KV caches the processes allocate themselves, pulled with read_blocks: host memory
  # (torch or numpy over shared memory), then simulated GPUs.
  add_test(NAME example_disagg_prefill_decode
           COMMAND ${FERRY_PYTHON} ${PROJECT_SOURCE_DIR}/examples/disagg_prefill_decode.py)
  add_test(NAME example_disagg_prefill_decode_sim_gpu
           COMMAND ${FERRY_PYTHON} ${PROJECT_SOURCE_DIR}/examples/disagg_prefill_decode.py
                   --sim-gpu)
  set_tests_properties(python_tensors example_grad_exchange example_kv_stream
                       example_disagg_prefill_decode example_disagg_prefill_decode_sim_gpu PROPERTIES
                       LABELS integration TIMEOUT 300 ENVIRONMENT "${FERRY_PY_ENV}")
endif()

# The vLLM connector's harness (tests/vllm).
include(${CMAKE_CURRENT_LIST_DIR}/vllm.cmake)
