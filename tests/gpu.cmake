# GPU checks (label `gpu`): the CUDA memory backend and CUDA IPC mapping from a second
# process. Every test skips, printing why, where CreateCudaGpus finds no GPU (no driver, no
# device, or a build without CUDA). tests/gpu/run.sh builds and runs them on a GPU machine.
add_executable(gpu_ipc_helper ${CMAKE_CURRENT_SOURCE_DIR}/gpu_ipc_helper.cc)
target_link_libraries(gpu_ipc_helper PRIVATE ferry_gpu_mapping ferry_memory absl::strings
                      absl::synchronization)

ferry_test(gpu_memory_test LABELS gpu LIBS ferry_memory absl::strings absl::synchronization)
target_compile_definitions(gpu_memory_test PRIVATE
  FERRY_GPU_IPC_HELPER="$<TARGET_FILE:gpu_ipc_helper>")
add_dependencies(gpu_memory_test gpu_ipc_helper)

# The client of tests/gpu/agent_run.sh (two agents moving GPU buffers to each other, staged):
# maps both agents' buffers by CUDA IPC and checks every transfer by checksum. Built without
# CUDA too, where it drives agents with simulated GPUs (the script's dry run).
add_executable(gpu_staged_client ${CMAKE_CURRENT_SOURCE_DIR}/gpu_staged_client.cc)
target_link_libraries(gpu_staged_client PRIVATE ferry_client ferry_memory absl::str_format
                      absl::strings absl::synchronization)

# CUDA VMM import by shareable fd; the test allocates with the driver's VMM calls itself.
ferry_test(gpu_vmm_test LABELS gpu LIBS ferry_memory absl::strings absl::synchronization)
if(FERRY_HAVE_CUDA)
  target_link_libraries(gpu_vmm_test PRIVATE CUDA::cudart_static)
endif()
