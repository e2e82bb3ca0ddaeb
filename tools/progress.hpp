// A progress line on stderr for the file subcommands: shown only when stderr is a terminal and
// only once the work has run for a second (TWELL_PROGRESS=always: from the first step), so
// scripts and quick runs see nothing. Cleared before the command prints its results.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace twell::cli {

class Progress {
 public:
  explicit Progress(int steps) : steps_(steps), tty_(isatty(STDERR_FILENO) != 0) {
    const char* when = std::getenv("TWELL_PROGRESS");
    if (when != nullptr && std::string_view(when) == "always") delay_ = {};
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() { clear(); }

  // Erases the line, if drawn: what is printed next (on stdout or stderr, the same terminal)
  // starts at the left margin instead of after the bar. A later step draws it again.
  void clear() {
    if (!shown_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    shown_ = false;
  }

  // Marks the start of step `label`; draws the bar when the run has passed a second.
  void step(std::string_view label) {
    ++done_;
    if (!tty_ || std::chrono::steady_clock::now() - start_ < delay_) return;
    constexpr int kWidth = 24;
    const int filled = kWidth * (done_ - 1) / steps_;
    std::fprintf(stderr, "\r\033[K[%.*s%.*s] %d/%d %.*s", filled, "########################", kWidth - filled,
                 "                        ", done_, steps_, static_cast<int>(label.size()), label.data());
    std::fflush(stderr);
    shown_ = true;
  }

 private:
  int steps_;
  int done_ = 0;
  bool tty_;
  bool shown_ = false;
  std::chrono::steady_clock::duration delay_ = std::chrono::seconds(1);
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace twell::cli
