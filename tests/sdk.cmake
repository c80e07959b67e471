# libferry, the installable SDK (client/sdk/): examples/cpp built against an install of this
# build (find_package and pkg-config) and, as add_subdirectory users build it, against the
# ferry::client target in this tree; each run against a real agent. And the public calls
# tested one by one from a program of that kind.
if(TARGET ferry_sdk)
  add_executable(sdk_example_in_tree ${PROJECT_SOURCE_DIR}/examples/cpp/put_get.cc)
  target_link_libraries(sdk_example_in_tree PRIVATE ferry::client)
  add_test(NAME sdk_install
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/sdk_install_test.sh ${CMAKE_BINARY_DIR}
                   ${PROJECT_SOURCE_DIR} $<TARGET_FILE:sdk_example_in_tree>)
  # nosan: a sanitizer build's libferry needs the sanitizer's runtime, which the example,
  # built as a user would build it, does not link.
  set_tests_properties(sdk_install PROPERTIES LABELS "integration;nosan" TIMEOUT 300)

  # The public calls against a real agent, from a program that sees only <ferry/...> (a
  # notification's payload through WaitNotification and PollNotifications).
  add_executable(sdk_notifications_test sdk_notifications_test.cc)
  target_link_libraries(sdk_notifications_test PRIVATE ferry::client GTest::gtest
                                                       GTest::gtest_main GTest::gmock)
  add_test(NAME sdk_notifications
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/sdk_with_agent.sh $<TARGET_FILE:ferryd>
                   $<TARGET_FILE:sdk_notifications_test>)
  set_tests_properties(sdk_notifications PROPERTIES LABELS integration TIMEOUT 120)

  # An agent restart as a program sees it: the test starts, kills (SIGKILL) and restarts
  # $FERRYD itself, by pid, on one socket.
  add_executable(sdk_restart_test sdk_restart_test.cc)
  target_link_libraries(sdk_restart_test PRIVATE ferry::client GTest::gtest GTest::gtest_main
                                                 GTest::gmock)
  add_test(NAME sdk_restart COMMAND sdk_restart_test)
  set_tests_properties(sdk_restart PROPERTIES LABELS integration TIMEOUT 120
                                              ENVIRONMENT "FERRYD=$<TARGET_FILE:ferryd>")
endif()
