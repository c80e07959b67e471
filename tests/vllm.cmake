# ferry.vllm.FerryConnector driven in vLLM's call order (tests/vllm/engine.py, no vLLM
# needed): a prefill and a decode engine, each a scheduler process and TP worker processes
# with their own ferryd, at TP 1->1, 2->4 and 4->2, on host memory and on simulated GPUs,
# with the prefill agent killed mid-pull and both agents restarted between requests. The
# CUDA variant skips here (no GPU); tests/gpu/run.sh runs it. Included by tests/tensors.cmake.
if(TARGET ferry_python)
  # ferry.vllm is pure Python: the build tree's package gets python/ferry/vllm's files as
  # they are, whenever ferry_python is built (so a test run after building it sees them).
  file(GLOB vllm_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/ferry/vllm/*.py)
  set(vllm_outputs)
  foreach(src ${vllm_sources})
    get_filename_component(f ${src} NAME)
    add_custom_command(OUTPUT ${FERRY_PYTHONPATH}/ferry/vllm/${f}
                       COMMAND ${CMAKE_COMMAND} -E copy ${src} ${FERRY_PYTHONPATH}/ferry/vllm/${f}
                       DEPENDS ${src})
    list(APPEND vllm_outputs ${FERRY_PYTHONPATH}/ferry/vllm/${f})
  endforeach()
  add_custom_target(ferry_python_vllm DEPENDS ${vllm_outputs})
  add_dependencies(ferry_python ferry_python_vllm)
  add_test(NAME python_vllm_connector
           COMMAND ${FERRY_PYTHON} -m pytest -q -rs -p no:cacheprovider
                   ${CMAKE_CURRENT_SOURCE_DIR}/vllm)
  set_tests_properties(python_vllm_connector PROPERTIES LABELS integration TIMEOUT 120
                       ENVIRONMENT "PYTHONPATH=${FERRY_PYTHONPATH}:${CMAKE_CURRENT_SOURCE_DIR}/vllm;FERRYD=$<TARGET_FILE:ferryd>")
endif()
