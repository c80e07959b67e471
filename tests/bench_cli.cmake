# ferry-bench's command line: --help is the usage on stdout (exit 0), a flag missing its
# value still says so.
if(TARGET ferry-bench)
  add_test(NAME bench_cli
           COMMAND sh -c "set -e
             out=$(\"$0\" --help); first=$(echo \"$out\" | head -1)
             [ \"$first\" = 'usage: ferry-bench [options]' ] || { echo \"--help: $first\"; exit 1; }
             echo \"$out\" | grep -q -- '--agents A,B' || { echo 'no --agents'; exit 1; }
             if \"$0\" --suite 2>err.txt; then echo '--suite alone passed'; exit 1; fi
             grep -qx 'ferry-bench: --suite needs a value' err.txt || { cat err.txt; exit 1; }
             if \"$0\" nonsense 2>err.txt; then echo 'nonsense passed'; exit 1; fi
             grep -q -- '--help lists' err.txt || { cat err.txt; exit 1; }
             rm -f err.txt" $<TARGET_FILE:ferry-bench>
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(bench_cli PROPERTIES LABELS unit)
endif()
