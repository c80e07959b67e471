# `ferryctl topo` / `ferryctl doctor`; include()d from client/CMakeLists.txt.
add_library(ferry_topo_command STATIC ${CMAKE_CURRENT_LIST_DIR}/topo_command.cc)
target_link_libraries(ferry_topo_command PUBLIC ferry_topology ferry_config absl::statusor)
