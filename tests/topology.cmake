# Topology, NIC choice, GDR plan, doctor and `ferryctl topo` / `doctor` tests. Fixtures:
# tests/fixtures/topology/*.xml (hwloc machines) and tests/fixtures/sysfs/* (fake roots).
if(NOT TARGET ferry_topo_command)
  include(${PROJECT_SOURCE_DIR}/client/topo_command.cmake)
endif()

foreach(t json_writer_test topology_test topology_plan_test doctor_test topo_command_test)
  ferry_test(${t} LABELS unit LIBS ferry_topo_command ferry_topology)
  target_compile_definitions(${t} PRIVATE
    FERRY_FIXTURES="${CMAKE_CURRENT_SOURCE_DIR}/fixtures")
endforeach()
