# SYMPRUNE_FUZZ: libFuzzer harnesses (tests/fuzz). Clang only, in its own build directory (build-fuzz):
# every library is instrumented for coverage and checked by ASan + UBSan; only the harnesses link the
# libFuzzer runtime. The default (GCC) build never sees these flags.
if(SYMPRUNE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "SYMPRUNE_FUZZ needs clang: configure with CC=clang CXX=clang++ (scripts/fuzz.sh does)")
  endif()
  if(SYMPRUNE_SANITIZE)
    message(FATAL_ERROR "SYMPRUNE_FUZZ already enables ASan + UBSan; leave SYMPRUNE_SANITIZE off")
  endif()
  # UB aborts (a finding), instead of printing and carrying on.
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer -g)
  add_link_options(-fsanitize=address,undefined)
endif()
