#!/bin/bash
# libferry as a user gets it: `cmake --install` of this build into a temporary prefix, then
# examples/cpp configured and built as a project of its own (find_package(ferry CONFIG)),
# the same program built by pkg-config, and both (and the in-tree build, if given) run
# against a real agent this script starts and stops by pid.
#   sdk_install_test.sh BUILD_DIR SOURCE_DIR [IN_TREE_EXAMPLE]
set -euo pipefail
build=$1 src=$2 in_tree=${3:-}
# shellcheck source=tests/one_agent.sh
. "$(dirname "$0")/one_agent.sh"

prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" ||
  { cat "$tmp/install.log"; fail "cmake --install"; }

# The library: a SONAME from the project version, and only the public API exported.
lib=$(find "$prefix" -name 'libferry.so' | head -1)
[ -n "$lib" ] || fail "no libferry.so under $prefix"
libdir=$(dirname "$lib")
version=$(sed -n 's/^project(ferry VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
echo "libferry $version: $(readlink "$lib") (SONAME $soname)"
[[ $soname == libferry.so.${version%.*} ]] || fail "SONAME '$soname' for version $version"
[ -f "$libdir/libferry.so.$version" ] || fail "no libferry.so.$version"
others=$(nm -D --defined-only "$lib" | c++filt | awk '{ $1 = ""; $2 = ""; print }' |
         grep -v '^  ferry::sdk::' || true)
[ -z "$others" ] || fail "libferry exports more than ferry::sdk: $(echo "$others" | head -5)"

# The headers: <ferry/...>, with nothing of gRPC or protobuf in them.
[ -f "$prefix/include/ferry/ferry_client.h" ] || fail "no include/ferry/ferry_client.h"
if grep -rnE '#include.*(grpc|\.pb\.h|protobuf)|google::protobuf|grpc::|v1::' \
     "$prefix/include/ferry"; then
  fail "gRPC or protobuf in the public headers"
fi
# Each header stands alone with the standard library and absl.
for h in "$prefix"/include/ferry/*.h; do
  echo "#include <ferry/${h##*/}>" | c++ -std=c++17 -fsyntax-only -x c++ - -I"$prefix/include" ||
    fail "<ferry/${h##*/}> does not compile alone"
done

# A project of its own, by find_package, and by pkg-config.
cmake -S "$src/examples/cpp" -B "$tmp/example" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$tmp/configure.log" ||
  { cat "$tmp/configure.log"; fail "configure examples/cpp"; }
cmake --build "$tmp/example" >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log"; fail "build examples/cpp"; }
export PKG_CONFIG_PATH=$libdir/pkgconfig
# shellcheck disable=SC2046
c++ -std=c++17 -o "$tmp/put_get_pc" "$src/examples/cpp/put_get.cc" \
  $(pkg-config --cflags --libs ferry) -Wl,-rpath,"$libdir" || fail "build with pkg-config"

# The installed agent, alone: the example's peer is its own node.
start_agent "$prefix/bin/ferryd" sdk-example
"$tmp/example/put_get" "$sock" || fail "put_get (find_package)"
"$tmp/put_get_pc" "$sock" >/dev/null || fail "put_get (pkg-config)"
if [ -n "$in_tree" ]; then "$in_tree" "$sock" >/dev/null || fail "put_get (in the build tree)"; fi
stop_agent
echo "PASS"
