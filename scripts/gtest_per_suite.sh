#!/usr/bin/env bash
# Runs a gtest binary one test suite per process, so that a fault that poisons a process (a CUDA kernel's
# illegal address is sticky: every later call in that process fails) costs one suite, not the run.
#
#   gtest_per_suite.sh XML_DIR FILTER BINARY [PREFIX...]
#
# The suites are those BINARY --gtest_list_tests --gtest_filter=FILTER lists; each runs as
# `PREFIX... BINARY --gtest_filter=SUITE.* --gtest_output=xml:XML_DIR/SUITE.xml` (PREFIX: e.g.
# `compute-sanitizer --tool memcheck --error-exitcode 3`). Prints one line per suite and, last, the
# skipped tests. Exit status: 0 when every suite passed and none skipped a test, 1 when a suite failed,
# 4 when all passed but some tests were skipped (on a GPU machine a skip means the device was not seen).
set -uo pipefail
usage="usage: gtest_per_suite.sh XML_DIR FILTER BINARY [PREFIX...]"
xml_dir="${1:?$usage}"
filter="${2:?$usage}"
binary="${3:?$usage}"
shift 3
mkdir -p "$xml_dir"
listing="$("$binary" --gtest_list_tests --gtest_filter="$filter")" || {
  echo "gtest_per_suite: $binary --gtest_list_tests failed" >&2
  exit 1
}
# Suite lines end with '.' and start in column 0 (tests are indented); '  # TypeParam' comments follow.
mapfile -t suites < <(printf '%s\n' "$listing" | awk '/^[^ ].*\.$/ {print $1}' | sed 's/\.$//')
if ((${#suites[@]} == 0)); then
  echo "gtest_per_suite: no test suite matches '$filter'" >&2
  exit 1
fi
failed=0
for suite in "${suites[@]}"; do
  start=$SECONDS
  xml="$xml_dir/${suite//\//_}.xml"
  "$@" "$binary" --gtest_filter="$suite.*" --gtest_output="xml:$xml"
  rc=$?
  printf 'gtest_per_suite: %-48s rc=%-3s %5ss\n' "$suite" "$rc" "$((SECONDS - start))"
  ((rc != 0)) && failed=1
done
skipped="$(sed -n 's/.*<testcase name="\([^"]*\)".*result="skipped".*classname="\([^"]*\)".*/\2.\1/p' "$xml_dir"/*.xml)"
if [[ -n $skipped ]]; then
  echo "gtest_per_suite: skipped tests:"
  printf '  %s\n' $skipped
fi
((failed)) && exit 1
[[ -n $skipped ]] && exit 4
exit 0
