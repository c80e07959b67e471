# The documentation's relative links (README.md, docs/*.md): each names a file of the
# repository, and each #anchor a heading of its page. Needs only python3, not the module.
find_package(Python3 QUIET COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME docs_links
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/docs_links_test.py
                   ${PROJECT_SOURCE_DIR})
  set_tests_properties(docs_links PROPERTIES LABELS unit)
  # The reshaping's limits (scripts/code-shape): no function in server/ over 150 lines, no
  # file in server/engine/ over 600.
  add_test(NAME code_shape
           COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/code-shape --check
                   server
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(code_shape PROPERTIES LABELS unit)
else()
  message(STATUS "ferry: docs_links test skipped (no python3)")
endif()
