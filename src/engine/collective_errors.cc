#include "engine/collective_errors.h"

#include <string>
#include <vector>

#include "core/error.h"
#include "core/interrupt.h"

namespace symprune::engine {

void agree_on_errors(dist::Communicator& comm, const std::function<void()>& stage) {
  if (comm.size() == 1) {
    stage();
    return;
  }
  std::string message;
  int64_t signal = 0;
  try {
    stage();
  } catch (const CollectiveError&) {
    throw;  // a nested agreement: every rank has it already
  } catch (const interrupt::Interrupted& e) {
    signal = e.signal();
    message = e.what();
  } catch (const Error& e) {
    message = e.what();
  }
  // Per rank: 0 (fine), 1 (error), 2 + signal (interrupted).
  const auto failure = dist::first_failure(comm, signal ? 2 + signal : (message.empty() ? 0 : 1), message);
  if (!failure) return;
  if (failure->status >= 2) throw interrupt::Interrupted(static_cast<int>(failure->status - 2));
  throw CollectiveError(failure->message);
}

void agree_on_interrupts(dist::Communicator& comm) {
  if (comm.size() == 1) {
    // received(), not check(): this point stops the run even where local checks are off.
    if (const int s = interrupt::received(); s != 0) throw interrupt::Interrupted(s);
    return;
  }
  std::vector<int64_t> signals(static_cast<size_t>(comm.size()), 0);
  signals[static_cast<size_t>(comm.rank())] = interrupt::received();
  comm.all_reduce_sum(signals);
  for (int64_t s : signals)
    if (s != 0) throw interrupt::Interrupted(static_cast<int>(s));
}

}  // namespace symprune::engine
