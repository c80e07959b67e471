# How clients find their agent and what ferryctl says without one: the default socket rule
# and the refusal of a missing socket (client/agent_channel.h), ferryctl's usage lines and
# `ferryctl certs` (tests/python/test_connect.py covers the Python side).
ferry_test(agent_channel_test LABELS unit LIBS ferry_client)
find_package(Python3 QUIET COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME ferryctl_cli
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/ferryctl_cli_test.py
                   $<TARGET_FILE:ferryctl>)
  set_tests_properties(ferryctl_cli PROPERTIES LABELS unit)
endif()
