# The Python package installed by pip into a venv (pyproject.toml, setup.py), then used
# from outside the tree against a real agent.
if(TARGET ferry_python)
  add_test(NAME python_package
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/python_package_test.sh ${CMAKE_BINARY_DIR}
                   ${PROJECT_SOURCE_DIR} ${FERRY_PYTHON} $<TARGET_FILE:ferryd>)
  set_tests_properties(python_package PROPERTIES LABELS integration TIMEOUT 300)
endif()
