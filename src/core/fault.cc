#include "core/fault.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/interrupt.h"

namespace symprune::fault {
namespace {

struct Rule {
  std::string point;
  int rank = -1;  // -1: every rank
  std::string action;
};

std::vector<Rule> parse(const char* spec) {
  std::vector<Rule> rules;
  std::string text(spec);
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    start = end + 1;
    const size_t colon = item.rfind(':');
    if (item.empty() || colon == std::string::npos) continue;
    Rule rule;
    rule.point = item.substr(0, colon);
    rule.action = item.substr(colon + 1);
    const size_t at_sign = rule.point.find('@');
    if (at_sign != std::string::npos) {
      rule.rank = std::atoi(rule.point.c_str() + at_sign + 1);
      rule.point.resize(at_sign);
    }
    rules.push_back(std::move(rule));
  }
  return rules;
}

const std::vector<Rule>& rules() {
  static const std::vector<Rule> parsed = [] {
    const char* spec = std::getenv("SYMPRUNE_FAULT");
    return spec ? parse(spec) : std::vector<Rule>{};
  }();
  return parsed;
}

}  // namespace

void at(std::string_view point, int rank) {
  for (const Rule& rule : rules()) {
    if (rule.point != point || (rule.rank >= 0 && rule.rank != rank)) continue;
    if (rule.action == "error") fail("injected fault at {} (SYMPRUNE_FAULT)", point);
    if (rule.action == "abort") std::abort();
    if (rule.action.starts_with("exit=")) ::_exit(std::atoi(rule.action.c_str() + 5));
    if (rule.action.starts_with("busy=")) {
      // A long computation that does not look at interrupts (only a second signal ends it).
      std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(rule.action.c_str() + 5)));
    }
    if (rule.action.starts_with("sleep=")) {
      // In steps, so that an interrupt ends the wait like any other long operation.
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::duration<double>(std::atof(rule.action.c_str() + 6));
      while (std::chrono::steady_clock::now() < until && interrupt::received() == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

}  // namespace symprune::fault
