#pragma once
// Errors in a run of several ranks: a rank that fails alone would leave the others waiting in the next
// collective. Stages whose failures a user causes (bad options, unusable paths, a full disk while
// writing) run under agree_on_errors: every rank learns whether any rank failed, and every rank then
// throws the same symprune::Error, with the message of the lowest failing rank, so all ranks end
// normally with that message. Failures elsewhere end all ranks through Communicator::abort (see
// apps/symprune_dist). With one rank it is just the call.
#include <functional>

#include "core/error.h"
#include "dist/communicator.h"

namespace symprune::engine {

// What agree_on_errors throws: every rank has it, so every rank can end normally with this message.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

void agree_on_errors(dist::Communicator& comm, const std::function<void()>& stage);

// Collective: whether any rank received an interrupt (core/interrupt.h); if so every rank throws
// interrupt::Interrupted with the lowest such rank's signal. The block loop's stopping point when ranks > 1.
void agree_on_interrupts(dist::Communicator& comm);

}  // namespace symprune::engine
