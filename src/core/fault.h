#pragma once
// Fault injection for tests of failure paths (interrupts, kills, errors on one rank): the environment
// variable SYMPRUNE_FAULT="POINT[@RANK]:ACTION[,...]" makes fault::at(POINT) act when the run reaches that
// point (on every rank, or only on RANK). Actions:
//   error       throw symprune::Error("injected fault at POINT")
//   sleep=S     sleep S seconds (to be killed or signalled there; an interrupt ends the sleep)
//   busy=S      sleep S seconds ignoring interrupts (a long step between safe points)
//   abort       std::abort() (a crash)
//   exit=N      _exit(N) without any clean-up (like a kill)
// Points are named where they are checked (e.g. "before_install", "block:3"). Unset, at() costs one
// branch on a cached flag.
#include <string_view>

namespace symprune::fault {

void at(std::string_view point, int rank = 0);

}  // namespace symprune::fault
