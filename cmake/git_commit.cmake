# Run at build time (cmake -P): writes OUT with the current git commit, only when it changed, so a
# commit is recorded in reports and provenance files without reconfiguring, and unchanged builds stay
# up to date. SOURCE_DIR: the checkout; OUT: the header to write.
execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --short=12 HEAD OUTPUT_VARIABLE commit
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE failed)
if(failed OR commit STREQUAL "")
  set(commit "unknown")
else()
  execute_process(COMMAND git -C "${SOURCE_DIR}" status --porcelain --untracked-files=no
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT changes STREQUAL "")
    string(APPEND commit "-dirty")
  endif()
endif()
set(text "#pragma once\n// Generated at build time by cmake/git_commit.cmake.\nnamespace symprune::build_info {\ninline constexpr const char* kGitCommit = \"${commit}\";\n}  // namespace symprune::build_info\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
