#include "engine/collective_errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

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

bool every_rank_sees(dist::Communicator& comm, bool seen, std::string_view subject) {
  if (comm.size() == 1) return seen;
  std::vector<int64_t> views(static_cast<size_t>(comm.size()), 0);
  views[static_cast<size_t>(comm.rank())] = seen ? 1 : 0;
  comm.all_reduce_sum(views);
  std::vector<int> with, without;
  for (int r = 0; r < comm.size(); ++r) (views[static_cast<size_t>(r)] != 0 ? with : without).push_back(r);
  if (without.empty()) return true;
  if (with.empty()) return false;
  throw CollectiveError(fmt::format(
      "{} is seen by rank(s) {} but not by rank(s) {}: every rank must see the same checkpoint files (put "
      "--checkpoint on a file system all nodes share, not on node-local disk)",
      subject, fmt::join(with, ", "), fmt::join(without, ", ")));
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
