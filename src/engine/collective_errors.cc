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
  std::vector<int64_t> status(static_cast<size_t>(comm.size()), 0);
  status[static_cast<size_t>(comm.rank())] = signal ? 2 + signal : (message.empty() ? 0 : 1);
  comm.all_reduce_sum(status);
  int failed = -1;
  for (int r = 0; r < comm.size() && failed < 0; ++r)
    if (status[static_cast<size_t>(r)] != 0) failed = r;
  if (failed < 0) return;
  int64_t length = static_cast<int64_t>(message.size());
  comm.broadcast(std::as_writable_bytes(std::span<int64_t>(&length, 1)), failed);
  message.resize(static_cast<size_t>(length));
  comm.broadcast(std::as_writable_bytes(std::span<char>(message.data(), message.size())), failed);
  const int64_t s = status[static_cast<size_t>(failed)];
  if (s >= 2) throw interrupt::Interrupted(static_cast<int>(s - 2));
  throw CollectiveError(message);
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
