#pragma once
// Errors in a run of several ranks: a rank that fails alone would leave the others waiting in the next
// collective. Stages whose failures a user causes (bad options, unusable paths, a full disk while
// writing) run under agree_on_errors: every rank learns whether any rank failed, and every rank then
// throws the same symprune::Error, with the message of the lowest failing rank, so all ranks end
// normally with that message. Failures elsewhere end all ranks through Communicator::abort (see
// apps/symprune_dist). With one rank it is just the call.
#include <functional>
#include <string_view>

#include "core/error.h"
#include "dist/communicator.h"

namespace symprune::engine {

// What agree_on_errors throws: every rank has it, so every rank can end normally with this message.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

void agree_on_errors(dist::Communicator& comm, const std::function<void()>& stage);

// Collective: whether every rank sees `subject` (a file they must all read, or a state such a file gives):
// `seen` is this rank's view. True when all do, false when none does; when only some do (a checkpoint on
// node-local disk where a shared file system is needed), every rank throws the same CollectiveError naming
// the ranks on each side, instead of going on to different collectives.
bool every_rank_sees(dist::Communicator& comm, bool seen, std::string_view subject);

// Collective: whether any rank received an interrupt (core/interrupt.h); if so every rank throws
// interrupt::Interrupted with the lowest such rank's signal. The block loop's stopping point when ranks > 1.
void agree_on_interrupts(dist::Communicator& comm);

}  // namespace symprune::engine
